"""Where a continuous-batching decode step of the corpus engine goes, for the datagen notes in
docs/RESULTS.md.

    .venv/bin/python scripts/profile_slot_step.py [--slots 128] [--answered 150] [--threads 1] [--out FILE.json]

1. One `SlotDecoder.decode` step of ``slots`` gsm8k_train chat prompts that have each
   answered ``answered`` tokens, the embedded target in bf16, ``--threads`` torch threads
   (default 1, as one `corpus grow` worker runs it; 2 as `dspark datagen` runs on 2 cores):
   the median step and torch.profiler's self time by operator.
2. The attention of one layer at that shape, three ways: the decoder's own call
   (scaled_dot_product_attention over the cache's strided slice), the same products as two
   batched matmuls over that strided slice, and over a contiguous copy (the copy not timed).
Prints JSON (and writes it with --out).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F


def timed(run, repeats: int = 10) -> float:
    """One warm-up call, then the median of ``repeats``."""
    from dspark.decoding.step_timing import median_seconds

    run()
    return median_seconds(run, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=128)
    parser.add_argument("--answered", type=int, default=150)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as one corpus grow worker)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from torch.profiler import ProfilerActivity, profile

    from dspark.bench.provenance import provenance
    from dspark.datasets import load_prompts
    from dspark.defaults import resolve_target
    from dspark.target import TargetModel
    from dspark.target.prompts import encode_prompt
    from dspark.target.slots import SlotDecoder

    target = TargetModel.from_pretrained(resolve_target(None), dtype=torch.bfloat16)
    prompts = [encode_prompt(target.tokenizer, p) for p in load_prompts("gsm8k_train", args.slots)]
    decoder = SlotDecoder(target.model, slots=args.slots, max_len=max(map(len, prompts)) + args.answered + 64)
    for slot, ids in enumerate(prompts):
        decoder.prefill(slot, ids)
    decoder.lengths += args.answered  # as if each had answered that many tokens
    lengths = decoder.lengths.clone()
    tokens = torch.full((args.slots,), 42)

    def step() -> None:
        decoder.decode(tokens)
        decoder.lengths.copy_(lengths)

    step_s = timed(step, 5)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    by_op = {e.key: round(100 * e.self_cpu_time_total / total, 1) for e in events[:8]}

    # One layer's attention at the step's shape: q [slots, kv heads, group, d] over the cache.
    b, kvh, d = args.slots, decoder.kv_heads, decoder.head_dim
    rep = decoder.heads // kvh
    span = int(lengths.max()) + 1
    k, v = decoder.k[0][:, :, :span], decoder.v[0][:, :, :span]
    q = torch.randn(b, kvh, rep, d, dtype=k.dtype)
    mask = (torch.arange(span)[None, :] <= lengths[:, None])[:, None, None, :]
    scale = d**-0.5

    def two_matmuls(keys, values) -> torch.Tensor:
        s = torch.bmm(q.reshape(b * kvh, rep, d), keys.reshape(b * kvh, span, d).transpose(1, 2)).float() * scale
        p = torch.softmax(s.view(b, kvh, rep, span).masked_fill(~mask, float("-inf")), -1).to(k.dtype)
        return torch.bmm(p.view(b * kvh, rep, span), values.reshape(b * kvh, span, d))

    kc, vc = k.contiguous(), v.contiguous()
    attention_ms = {
        "sdpa_strided_cache": timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)),
        "two_bmm_strided_cache": timed(lambda: two_matmuls(k, v)),
        "two_bmm_contiguous_copy": timed(lambda: two_matmuls(kc, vc)),
    }
    report = {
        "slots": args.slots,
        "answered": args.answered,
        "span": span,
        "step_ms": round(step_s * 1000, 1),
        "self_time_percent_by_operator": by_op,
        "one_layer_attention_ms": {key: round(t * 1000, 2) for key, t in attention_ms.items()},
        "layers": len(decoder.layers),
        "provenance": provenance(),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
