#!/usr/bin/env bash
# Create .venv with kerneltune and its development dependencies. Idempotent.
# On a CPU machine torch is pinned to the CPU build (2.13.0); on a GPU machine that already has
# torch and Triton, pass --system-site-packages through KERNELTUNE_VENV_FLAGS to reuse them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv ${KERNELTUNE_VENV_FLAGS:-} .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[dev]"
