"""Datagen throughput of the embedded target by batch size and dtype (HF generate, greedy).

    python scripts/profile_datagen.py 16,64 float32
    python scripts/profile_datagen.py 64,128 bfloat16

Generates exactly 64 new tokens for each of the first BATCH gsm8k_train questions and prints
tokens per second. The figures in docs/training.md ("Data") come from these two commands.
"""

import sys
import time

import torch

from dspark.datasets import training_prompts
from dspark.defaults import default_target_dir
from dspark.target.adapter import TargetModel
from dspark.training.datagen import encode_prompt

sizes, dtype = [int(x) for x in sys.argv[1].split(",")], getattr(torch, sys.argv[2])
target = TargetModel.from_pretrained(str(default_target_dir()), dtype=dtype)
tok = target.tokenizer
questions = training_prompts("gsm8k_train", max(sizes))
pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
for bs in sizes:
    enc = [encode_prompt(tok, q) for q in questions[:bs]]
    width = max(map(len, enc))
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc])
    attn = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc])
    start = time.time()
    with torch.inference_mode():
        target.model.generate(
            input_ids=ids, attention_mask=attn, max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=pad
        )
    seconds = time.time() - start
    print(f"batch {bs} {sys.argv[2]}: {seconds:.1f} s, {bs * 64 / seconds:.0f} tok/s", flush=True)
