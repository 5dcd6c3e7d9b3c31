#!/usr/bin/env bash
# Continue the three shipped peers (DSpark, DFlash, EAGLE-3) on a larger self-distilled set, at
# equal budget, and report their teacher-forced acceptance on held-out rows (CPU; ~1 h on 2 cores).
#   1. .cache/smollm2/data-more.jsonl: the first ROWS rows of .cache/smollm2/data-v3.jsonl (the
#      longer datagen output of scripts/train_default_drafter.sh's prompts; its first 672 rows are
#      the shipped drafters' data.jsonl); the HELDOUT rows after them are kept out for evaluation
#   2. .cache/smollm2/features-more: target features; shards holding only rows of data.jsonl are
#      linked from .cache/smollm2/features (same rows, same target, same layers) instead of recomputed
#   3. dspark train --config recipes/more-data/smollm2-135m-<method>.yaml for the three, side by side
#   4. dspark evaluate on the held-out rows and on 64 training rows, into .cache/smollm2/more-data-eval.txt
# Every stage resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
C=.cache/smollm2
ROWS=${ROWS:?set ROWS: how many rows of $C/data-v3.jsonl to train on}
HELDOUT=${HELDOUT:-64}
have=$(wc -l < "$C/data-v3.jsonl")
[ "$have" -ge $((ROWS + HELDOUT)) ] || { echo "$C/data-v3.jsonl has $have rows; need ROWS + HELDOUT = $((ROWS + HELDOUT))" >&2; exit 1; }
if [ ! -f "$C/data-more.jsonl" ]; then
  head -n "$ROWS" "$C/data-v3.jsonl" > "$C/data-more.jsonl.tmp" && mv "$C/data-more.jsonl.tmp" "$C/data-more.jsonl"
fi
[ "$(wc -l < "$C/data-more.jsonl")" = "$ROWS" ] || { echo "$C/data-more.jsonl exists with another row count; remove it" >&2; exit 1; }
cmp -s <(head -n 672 "$C/data-more.jsonl") "$C/data.jsonl" || { echo "$C/data-more.jsonl does not start with $C/data.jsonl" >&2; exit 1; }
if [ ! -f "$C/features-more/manifest.json" ]; then
  mkdir -p "$C/features-more"
  .venv/bin/python - "$C" "$ROWS" <<'PY'
import json, os, sys
c, rows = sys.argv[1], int(sys.argv[2])
old = json.load(open(f"{c}/features/manifest.json"))
full = 672 // old["shard_size"]  # shards holding only rows of data.jsonl
shards = {}
for s in range(full):
    name = f"shard_{s:05d}.safetensors"
    os.link(f"{c}/features/{name}", f"{c}/features-more/{name}")
    shards[name] = old["shards"][name]
new = {**{k: v for k, v in old.items() if k != "shards"}, "num_examples": rows, "shards": shards}
json.dump(new, open(f"{c}/features-more/manifest.json", "w"), indent=2)
PY
fi
.venv/bin/dspark cache-features --data "$C/data-more.jsonl" --out "$C/features-more" --aux-layers 2,15,27 --seq-len 512
pids=()
for method in dspark dflash eagle3; do
  OMP_NUM_THREADS=1 .venv/bin/dspark train --config "recipes/more-data/smollm2-135m-$method.yaml" \
    > "$C/run-$method-more.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
{
  for method in dspark dflash eagle3; do
    for d in "$C/run-$method/final" "$C/run-$method-more/final"; do
      echo "== $d held-out (rows $ROWS..$((ROWS + HELDOUT - 1)) of data-v3)"
      .venv/bin/dspark evaluate --data "$C/data-v3.jsonl" --draft "$d" --skip "$ROWS" --rows "$HELDOUT" --n 7 --json
    done
  done
} > "$C/more-data-eval.txt"
cat "$C/more-data-eval.txt"
