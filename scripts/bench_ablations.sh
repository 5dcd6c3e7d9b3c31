#!/usr/bin/env bash
# The ablation and confidence results of docs/RESULTS.md (embedded target, 2 CPU cores):
#   1. ablation: DFlash (rank 0, no confidence head) vs DSpark rank 64 (shipped) vs DSpark rank 64
#      without confidence head vs DSpark rank 256, greedy, n=3,7, one run. The two ablation
#      drafters come from ABLATIONS=1 bash scripts/train_default_drafter.sh (.cache/smollm2).
#   2. draft-length sweep: the shipped DSpark at n=7 without truncation, with survival
#      thresholds 0.2, 0.35, 0.5, 0.7, and with the cost-model rule (dspark@cost), one run.
#   3. calibration of the shipped drafter's confidence head on the benchmark prompts (held out
#      from training): ECE, AUROC, Brier per position, reliability diagram.
#   4. depth: the three shipped peers (1 layer each) against DSpark and DFlash with 3 decoder
#      layers (recipes/ablations/*-3layer.yaml), greedy, n=7, one run. Not in the default PARTS.
#   ROWS (5) prompts per dataset, TOKENS (128) new tokens; CAL_ROWS (10); PARTS picks stages.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-5}
TOKENS=${TOKENS:-128}
CAL_ROWS=${CAL_ROWS:-10}
OUT=${OUT:-docs/results}
RUNS=.cache/smollm2
mkdir -p "$OUT"
.venv/bin/dspark setup >/dev/null
DSPARK=models/smollm2-135m-dspark
for part in ${PARTS:-ablation threshold calibration}; do
  case $part in
    ablation)
      for run in noconf r256; do
        [ -d "$RUNS/run-dspark-$run/final" ] || { echo "missing $RUNS/run-dspark-$run/final: run ABLATIONS=1 METHODS= bash scripts/train_default_drafter.sh" >&2; exit 1; }
      done
      .venv/bin/dspark bench --datasets gsm8k,humaneval --rows "$ROWS" --max-new-tokens "$TOKENS" --n 3,7 \
        --methods "dflash,dspark,dspark-noconf=$RUNS/run-dspark-noconf/final,dspark-r256=$RUNS/run-dspark-r256/final" \
        --out "$OUT/ablation-smollm2-cpu.json" --markdown "$OUT/ablation-smollm2-cpu.md" ;;
    threshold)
      .venv/bin/dspark bench --datasets gsm8k,humaneval --rows "$ROWS" --max-new-tokens "$TOKENS" --n 7 \
        --methods "dspark,conf0.2=$DSPARK@0.2,conf0.35=$DSPARK@0.35,conf0.5=$DSPARK@0.5,conf0.7=$DSPARK@0.7,dspark@cost" \
        --out "$OUT/confidence-threshold-smollm2-cpu.json" --markdown "$OUT/confidence-threshold-smollm2-cpu.md" ;;
    calibration)
      .venv/bin/dspark calibrate --draft "$DSPARK" --datasets gsm8k,humaneval --rows "$CAL_ROWS" --n 7 \
        --max-new-tokens "$TOKENS" --out "$OUT/calibration-smollm2-cpu.json" \
        --markdown "$OUT/calibration-smollm2-cpu.md" --plot "$OUT/calibration-smollm2-cpu.png" ;;
    depth)
      for run in dspark-3layer dflash-3layer; do
        [ -d "$RUNS/run-$run/final" ] || { echo "missing $RUNS/run-$run/final: run ABLATIONS=1 METHODS= bash scripts/train_default_drafter.sh" >&2; exit 1; }
      done
      .venv/bin/dspark bench --datasets gsm8k,humaneval --rows "$ROWS" --max-new-tokens "$TOKENS" --n 7 \
        --methods "eagle3,dflash,dspark,dflash-3layer=$RUNS/run-dflash-3layer/final,dspark-3layer=$RUNS/run-dspark-3layer/final" \
        --out "$OUT/depth-smollm2-cpu.json" --markdown "$OUT/depth-smollm2-cpu.md" --plot "$OUT/depth-acceptance-smollm2-cpu.png" ;;
    *) echo "unknown part $part (ablation, threshold, calibration, depth)" >&2; exit 2 ;;
  esac
done
