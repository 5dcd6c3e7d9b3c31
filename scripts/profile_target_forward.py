"""Where a target verify goes on this machine: the figures behind the deferred output head,
the cost model's T(m) kink and the server's one-thread rule (docs/RESULTS.md).

    .venv/bin/python scripts/profile_target_forward.py [--target DIR] [--context 200]

Prints, after ``--context`` cached tokens:
1. median wall time of a target forward over m = 1, 2, 3, 4, 5, 8 new tokens, without its
   output projection, and of the output projection over 1, 2 and 8 rows;
2. the heaviest ops (torch.profiler, self CPU time by input shape) of forwards over 3, 4
   and 8 new tokens;
3. plain decoding tok/s (8 gsm8k prompts x 32 tokens) on the main thread, then on a second
   thread after the main thread has run torch kernels (what `dspark serve` used to do).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def median_ms(fn, repeats: int = 9) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target")
    parser.add_argument("--context", type=int, default=200)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from torch.profiler import ProfilerActivity, profile

    from dspark.datasets import load_prompts
    from dspark.decoding.factory import make_engine
    from dspark.decoding.sampling import SamplingParams
    from dspark.defaults import resolve_target
    from dspark.target import TargetModel
    from dspark.target.prompts import encode_prompt

    target = TargetModel.from_pretrained(resolve_target(args.target))
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(100, target.vocab_size, (args.context,), generator=gen)
    new = torch.randint(100, target.vocab_size, (8,), generator=gen)
    target.reset()
    target.forward(ctx)

    def forward(m: int):
        step = target.forward(new[:m])
        target.crop(args.context)
        return step

    print(f"1. after {args.context} cached tokens (ms, median of 9):")
    for m in (1, 2, 3, 4, 5, 8):
        print(f"   forward over {m} new token(s), no output projection: {median_ms(lambda m=m: forward(m)):.1f}")
    step = forward(8)
    for rows in (1, 2, 8):
        print(f"   output projection of {rows} row(s): {median_ms(lambda rows=rows: step.rows(0, rows)):.1f}")

    print("2. heaviest ops, ms per forward (5 forwards each):")
    for m in (3, 4, 8):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(5):
                forward(m).rows(0, m)
        events = sorted(
            (e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")),
            key=lambda e: -e.self_cpu_time_total,
        )
        print(f"   m={m}:")
        for e in events[:6]:
            print(f"     {e.key} {e.input_shapes[:2]}: {e.self_cpu_time_total / 1000 / 5:.2f} ({e.count // 5} calls)")

    engine = make_engine(target, None, 0)
    prompts = [encode_prompt(target.tokenizer, p) for p in load_prompts("gsm8k", 8)]

    def decode_rate(out: dict, key: str) -> None:
        tokens = seconds = 0.0
        for ids in prompts:
            result = engine.generate(ids, max_new_tokens=32, params=SamplingParams())
            tokens += len(result.tokens) - 1
            seconds += result.decode_seconds
        out[key] = tokens / seconds

    rates: dict[str, float] = {}
    decode_rate(rates, "main thread")
    worker = threading.Thread(target=decode_rate, args=(rates, "second thread"))
    worker.start()
    worker.join()
    print("3. plain decoding, 8 gsm8k prompts x 32 tokens:")
    for key, rate in rates.items():
        print(f"   {key}: {rate:.1f} tok/s")


if __name__ == "__main__":
    main()
