#!/usr/bin/env bash
# Markov head type ablation (issue 4): the shipped DSpark drafter continued on the stage-2 data with a
# gated and with an rnn Markov head, at the vanilla stage-2 run's budget (4000 steps, lr 5e-4 warm
# restart), both side by side (one thread each, ~18 min on 2 cores), then teacher-forced acceptance
# on the stage-2 held-out rows for vanilla (recipes/stage2/smollm2-135m-dspark.yaml's run), gated
# and rnn. Needs the stage-2 data and feature cache and the vanilla stage-2 run:
# `ROWS=1984 bash scripts/train_stage2.sh` first. Every stage resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
C=.cache/smollm2-v2
for f in "$C/data-train.jsonl" "$C/data-heldout.jsonl" "$C/features/manifest.json" "$C/run-dspark/final/config.json"; do
  [ -f "$f" ] || { echo "missing $f: run ROWS=1984 bash scripts/train_stage2.sh first" >&2; exit 1; }
done
pids=()
for kind in gated rnn; do
  [ -d "$C/init-dspark-$kind" ] || .venv/bin/python scripts/markov_head_variant.py models/smollm2-135m-dspark "$C/init-dspark-$kind" "$kind"
  OMP_NUM_THREADS=1 .venv/bin/dspark train --config "recipes/stage2/smollm2-135m-dspark-$kind.yaml" --no-progress \
    > "$C/run-dspark-$kind.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for run in run-dspark run-dspark-gated run-dspark-rnn; do
  echo "== $C/$run/final held-out"
  .venv/bin/dspark evaluate --data "$C/data-heldout.jsonl" --draft "$C/$run/final" --rows 64 --n 7 --json
done | tee "$C/head-variants-eval.txt"
