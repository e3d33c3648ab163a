#!/usr/bin/env bash
# Render (`template`) or lint (`lint`) the chart offline with Helm's own engine, as `helm template`
# and `helm lint --strict` would, without a `helm` binary: sets up .venv like scripts/test.sh, then
# runs scripts/chart.py. Example: ./scripts/chart.sh template -f my-values.yaml > kube-vgpu.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -c 'import helm_python' 2>/dev/null \
  || .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
exec .venv/bin/python scripts/chart.py "$@"
