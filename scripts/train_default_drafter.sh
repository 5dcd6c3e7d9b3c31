#!/usr/bin/env bash
# Rebuild the embedded default drafter from scratch on this machine (CPU; hours on 2 cores).
# Every stage resumes: rerun the script after an interruption.
#   1. prompts: gsm8k_train questions + standard-library code prompts (none from the benchmarks)
#   2. dspark datagen: SmolLM2 answers them itself (greedy, <= 192 new tokens)
#   3. dspark vocab: 8192 most frequent assistant tokens
#   4. dspark train: recipes/smollm2-135m-dspark.yaml (online source)
#   5. copy the final drafter to models/smollm2-135m-dspark (bf16, without the target's embedding)
set -euo pipefail
cd "$(dirname "$0")/.."
N_GSM=${N_GSM:-400}
mkdir -p .cache/smollm2
.venv/bin/dspark setup >/dev/null
ln -sfn "$(.venv/bin/python -c 'from dspark.defaults import default_target_dir; print(default_target_dir())')" .cache/target
if [ ! -f .cache/smollm2/prompts.jsonl ]; then
  .venv/bin/python - "$N_GSM" <<'PY'
import json, random, sys
from dspark.training.prompt_sources import stdlib_code_prompts
n = int(sys.argv[1])
random.seed(0)
gsm = [json.loads(l)["question"] for l in open("../shared/data/gsm8k_train.jsonl")]
code = stdlib_code_prompts()
random.shuffle(gsm); random.shuffle(code)
with open(".cache/smollm2/prompts.jsonl", "w") as f:
    for i in range(n):
        f.write(json.dumps({"prompt": gsm[i]}) + "\n")
        if i < len(code):
            f.write(json.dumps({"prompt": code[i]}) + "\n")
PY
fi
.venv/bin/dspark datagen --prompts .cache/smollm2/prompts.jsonl --out .cache/smollm2/data.jsonl \
  --max-new-tokens 192 --batch-size 16
[ -f .cache/smollm2/vocab.safetensors ] || .venv/bin/dspark vocab --data .cache/smollm2/data.jsonl --size 8192 \
  --out .cache/smollm2/vocab.safetensors
.venv/bin/dspark train --config recipes/smollm2-135m-dspark.yaml
.venv/bin/python - <<'PY'
import torch
from dspark.model.checkpoint import load_drafter, save_drafter
from dspark.target import TargetModel
from dspark.defaults import default_target_dir, default_draft_dir
target = TargetModel.from_pretrained(default_target_dir())
model = load_drafter(".cache/smollm2/run/final", target_embedding=target.embedding_weight())
save_drafter(model, default_draft_dir(), dtype=torch.bfloat16, include_embeddings=False)
print("wrote", default_draft_dir())
PY
