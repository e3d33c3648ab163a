"""`python -m cli` runs the kube-vgpu command."""

import sys

from cli.main import main

sys.exit(main())
