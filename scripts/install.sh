#!/usr/bin/env bash
# Create ./.venv (if missing) and install dspark with its dev extras.
# torch is pinned to the CPU wheel here; GPU users install their own torch first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[dev,ray,gguf,serve,bench]"
