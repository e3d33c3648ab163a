"""`python -m kube_vgpu` runs the kube-vgpu command."""

import sys

from kube_vgpu.cli.main import main

sys.exit(main())
