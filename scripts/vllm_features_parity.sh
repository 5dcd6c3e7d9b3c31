#!/usr/bin/env bash
# Training from vLLM-extracted features against training from our own: DSpark on the first
# 1162 rows of the corpus's train split (one epoch, the recipe's settings and seed), its
# features computed by a vLLM hidden-state server (`dspark vllm-hidden-states --run`, vLLM's
# CPU build, fp32) into a feature cache (`cache-features --vllm`), then scored on the
# held-out split beside the same run from our features (scripts/scaling_curve.sh's
# dspark-1162 from bf16-target features and dspark-1162-fp32features), all three in one
# `dspark evaluate` (teacher forced, n=7, 160 rows x 32 blocks, seed 0).
# Needs .cache/corpus-train from scripts/train_default_drafter.sh and scripts/scaling_curve.sh
# (CHECK_FEATURES=1). Writes docs/results/vllm-features-training-smollm2-cpu.json.
set -euo pipefail
cd "$(dirname "$0")/.."
C=.cache/corpus-train
PORT=${PORT:-8011}
OUT=$C/scale/dspark-1162-vllmfeatures
[ -f "$C/train-1162.jsonl" ] || head -n 1162 "$C/train.jsonl" > "$C/train-1162.jsonl"
if [ ! -d "$OUT/final" ]; then
  .venv/bin/dspark vllm-hidden-states --aux-layers 2,15,27 --port "$PORT" --max-model-len 1024 --run \
    > "$C/vllm-hidden-states.log" 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null || true' EXIT
  until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
    kill -0 $server 2>/dev/null || { cat "$C/vllm-hidden-states.log"; exit 1; }
    sleep 3
  done
  start=$(date +%s)
  .venv/bin/dspark cache-features --data "$C/train-1162.jsonl" --out "$C/features-vllm-1162" --aux-layers 2,15,27 \
    --seq-len 512 --vllm "http://127.0.0.1:$PORT" --concurrency 8
  echo "vLLM features: $(( $(date +%s) - start )) s" | tee "$C/features-vllm-1162.time"
  kill $server; wait $server 2>/dev/null || true
  OMP_NUM_THREADS=1 .venv/bin/dspark train --config recipes/smollm2-135m-dspark.yaml --no-progress \
    --set data="$C/train-1162.jsonl" --set cache="$C/features-vllm-1162" --set train.steps=1162 \
    --set out="$OUT" > "$OUT.log" 2>&1
fi
.venv/bin/dspark evaluate --data "$C/heldout.jsonl" --rows 160 --anchors 32 --max-len 512 --seed 0 --json \
  --draft "$C/scale/dspark-1162/final" --draft "$C/scale/dspark-1162-fp32features/final" --draft "$OUT/final" \
  > docs/results/vllm-features-training-smollm2-cpu.json
cat docs/results/vllm-features-training-smollm2-cpu.json
