#!/usr/bin/env bash
# Train the embedded drafters (DSpark, DFlash, EAGLE-3 for SmolLM2-135M-Instruct) on the
# corpus in corpus/smollm2-135m-instruct, on this machine's CPU (about 2 h per 10,000 corpus
# rows on 2 cores; the feature cache takes ~4.6 KB a token of disk).
# Every stage resumes: rerun the script after an interruption.
#   1. dspark corpus export: the train split in a seeded order (any prefix is a fair sample,
#      which the scaling curve uses) and the held-out split (prompt-key bucket 0 of 64)
#   2. dspark vocab: the 8192 most frequent assistant tokens of the train split
#   3. dspark cache-features: the target's features once for every drafter (two worker
#      processes; the target in bf16 where the CPU computes it natively, AVX512-BF16 or AMX,
#      else in fp32: emulated bf16 is 8-14x slower); FEATURES=stream skips the cache (no disk)
#      and trains the drafters together on one stream of the target's features instead
#      (`dspark train --config A --config B ...`, the target in its own processes)
#   4. dspark train: recipes/smollm2-135m-{dspark,dflash,eagle3}.yaml side by side, one
#      torch thread each (METHODS= picks some); same data, vocab, features and budget:
#      EPOCHS (default 1) passes over the train export, one row per step (train.steps is
#      set from the export's row count, so the recipes need no edit when the corpus grows);
#      ROWS=N uses the export's first N rows only (a budget that fits a session)
#   5. copy each final drafter to models/smollm2-135m-<method> (bf16, without the target's
#      embedding) with TRAINING.json (budget, loss, teacher-forced accept_len on held-out rows),
#      unless it scores lower on the held-out rows than the drafter already there (then its
#      summary is run-<method>/TRAINING-candidate.json; FORCE=1 ships it anyway)
#   6. SCALING=1: the scaling curve (scripts/scaling_curve.sh)
#   7. ABLATIONS=1: recipes/ablations/*.yaml too (not shipped)
set -euo pipefail
cd "$(dirname "$0")/.."
C=.cache/corpus-train
CORPUS=corpus/smollm2-135m-instruct
mkdir -p "$C"
.venv/bin/dspark setup >/dev/null
ln -sfn "$(.venv/bin/python -c 'from dspark.defaults import default_target_dir; print(default_target_dir())')" .cache/target
# The exports, vocab and features belong to the corpus as it was when they were made: if it
# has grown since, stop rather than train on a stale export (move $C away to start over).
rows=$(.venv/bin/dspark corpus status "$CORPUS" --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["rows"])')
if [ -f "$C/corpus-rows" ] && [ "$(cat "$C/corpus-rows")" != "$rows" ]; then
  echo "$C was built from $(cat "$C/corpus-rows") corpus rows; $CORPUS now holds $rows. Move $C away to retrain." >&2
  exit 2
fi
echo "$rows" > "$C/corpus-rows"
[ -f "$C/train.jsonl" ] || .venv/bin/dspark corpus export "$CORPUS" --out "$C/train.jsonl" --split train --seed 0
[ -f "$C/heldout.jsonl" ] || .venv/bin/dspark corpus export "$CORPUS" --out "$C/heldout.jsonl" --split heldout
[ -f "$C/vocab.safetensors" ] || .venv/bin/dspark vocab --data "$C/train.jsonl" --size 8192 --out "$C/vocab.safetensors"
METHODS=${METHODS-dspark dflash eagle3}
# ROWS=N trains on the first N rows of the train split only (any prefix is a fair sample).
rows_used=${ROWS:-$(wc -l < "$C/train.jsonl")}
steps=$(( rows_used * ${EPOCHS:-1} ))
limit=()
[ -n "${ROWS:-}" ] && limit=(--set train.max_examples="$ROWS")
if [ "${FEATURES:-cache}" = stream ]; then
  # No feature cache: one target process streams each row's features to all the trainers.
  configs=()
  for method in $METHODS; do configs+=(--config "recipes/smollm2-135m-$method.yaml"); done
  if [ ${#configs[@]} -gt 0 ]; then
    # TARGET_WORKERS: one-thread target processes, each computing every N-th row (2 on these
    # 2 cores: the trainers wait on one). TARGET_THREADS: torch threads of each.
    workers=${TARGET_WORKERS:-2}
    threads=${TARGET_THREADS:-1}
    OMP_NUM_THREADS=1 .venv/bin/dspark train "${configs[@]}" --no-progress --set source=online --set target_dtype=auto \
      --set target_threads="$threads" --set target_workers="$workers" --set train.steps="$steps" "${limit[@]}" \
      > "$C/train-together.log" 2>&1
  fi
else
  .venv/bin/dspark cache-features --data "$C/train.jsonl" --out "$C/features-bf16" --aux-layers 2,15,27 --seq-len 512 \
    --target-dtype auto --workers "${WORKERS:-2}"
  pids=()
  for method in $METHODS; do
    OMP_NUM_THREADS=1 .venv/bin/dspark train --config "recipes/smollm2-135m-$method.yaml" --no-progress \
      --set train.steps="$steps" "${limit[@]}" > "$C/train-$method.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done  # a failed run stops the script (its log says why)
fi
for method in $METHODS; do
  .venv/bin/python scripts/export_default_drafter.py "$method"
done
[ "${SCALING:-}" = 1 ] && bash scripts/scaling_curve.sh
if [ "${ABLATIONS:-}" = 1 ]; then
  for recipe in recipes/ablations/*.yaml; do
    .venv/bin/dspark train --config "$recipe"
  done
fi
