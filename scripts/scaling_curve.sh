#!/usr/bin/env bash
# The scaling curve of the embedded drafters: DSpark, DFlash and EAGLE-3 trained on the first
# N rows of the corpus's seeded train split (SIZES, default 1162 2324 4649), one epoch each
# (N steps of one row: the same steps per token as the full recipes), from the feature cache
# scripts/train_default_drafter.sh builds; then every run and the full ones are scored on the
# held-out split (teacher-forced accept_len at n=7) by scripts/scaling_report.py, which writes
# docs/results/scaling-smollm2-cpu.{json,md,png}. Resumes: finished runs are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
C=.cache/corpus-train
mkdir -p "$C/scale"
for size in ${SIZES:-1162 2324 4649}; do
  pids=()
  for method in ${METHODS:-dspark dflash eagle3}; do
    out="$C/scale/$method-$size"
    [ -d "$out/final" ] && continue
    OMP_NUM_THREADS=1 .venv/bin/dspark train --config "recipes/smollm2-135m-$method.yaml" --no-progress \
      --set train.max_examples="$size" --set train.steps="$size" --set out="$out" > "$out.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
done
# CHECK_FEATURES=1: DSpark on the first 1162 rows again, from features of the fp32 target, to
# show that the bf16 target's features (what the recipes use) cost no held-out acceptance.
if [ "${CHECK_FEATURES:-}" = 1 ] && [ ! -d "$C/scale/dspark-1162-fp32features/final" ]; then
  head -n 1162 "$C/train.jsonl" > "$C/train-1162.jsonl"
  .venv/bin/dspark cache-features --data "$C/train-1162.jsonl" --out "$C/features-fp32-1162" --aux-layers 2,15,27 \
    --seq-len 512 --workers 2
  OMP_NUM_THREADS=1 .venv/bin/dspark train --config recipes/smollm2-135m-dspark.yaml --no-progress \
    --set data="$C/train-1162.jsonl" --set cache="$C/features-fp32-1162" --set train.steps=1162 \
    --set out="$C/scale/dspark-1162-fp32features" > "$C/scale/dspark-1162-fp32features.log" 2>&1
fi
.venv/bin/python scripts/scaling_report.py
