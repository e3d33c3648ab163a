#!/usr/bin/env bash
# The test command: sets up .venv from scratch if needed, then lint, types and the whole test suite.
# CI (.ci/run) runs exactly this on a clean clone.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy (strict, the code and the tests: files in pyproject.toml)"
.venv/bin/mypy
echo "== import layers"
.venv/bin/lint-imports --no-cache
echo "== dead code"
# vulture exits 3 on any finding; what it cannot see used (gRPC servicers, wire-format fields, the
# stand-ins' controls that tests drive) is listed, with why, in vulture_allowlist.py.
.venv/bin/vulture src/kube_vgpu vulture_allowlist.py --min-confidence 60 --exclude '*_pb2*'
echo "== pytest"
# pytest exits 5 when it collected no test; set -e turns that (like any failure) into a failed run.
.venv/bin/pytest -q -p no:cacheprovider "$@"
