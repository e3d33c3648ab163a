#!/usr/bin/env bash
# The main job on one machine, no cluster and no GPU: sets up .venv if needed, then runs
# `kube-vgpu demo` (webhook over HTTPS, node plugins on simulated GPUs, stand-in kubelet, API
# server and Volcano), which admits and allocates the example pods. Extra arguments go to the demo
# (e.g. --once to exit after the examples).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
exec .venv/bin/kube-vgpu demo "$@"
