"""Would batching verification across sequences help on this machine? Times one target
forward over 8 new tokens (anchor + 7 drafts) for B sequences at once against B forwards
of one sequence each, with a KV cache of ``--context`` tokens per sequence.

    .venv/bin/python scripts/verify_batch_cost.py [--target DIR] [--batches 1,2,4,8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target")
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--new", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from transformers import AutoModelForCausalLM, DynamicCache

    from dspark.defaults import resolve_target

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(resolve_target(args.target), dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        ctx = torch.randint(0, vocab, (b, args.context))
        new = torch.randint(0, vocab, (b, args.new))
        times = []
        with torch.inference_mode():
            for _ in range(args.repeats):
                cache = DynamicCache()
                model(input_ids=ctx, past_key_values=cache, use_cache=True)
                t0 = time.perf_counter()
                model(input_ids=new, past_key_values=cache, use_cache=True)
                times.append(time.perf_counter() - t0)
        batched = statistics.median(times)
        rows.append({"batch": b, "batched_forward_ms": batched * 1e3})
    single = rows[0]["batched_forward_ms"]
    for r in rows:
        r["one_at_a_time_ms"] = single * r["batch"]
        r["batched_vs_sequential"] = r["batched_forward_ms"] / r["one_at_a_time_ms"]
    print(json.dumps({"context": args.context, "new_tokens": args.new, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
