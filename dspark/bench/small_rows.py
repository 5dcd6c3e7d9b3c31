"""Few-row products written W @ xᵀ (`dspark.target.small_rows`) against `F.linear`: one run.

    python -m dspark.bench.small_rows --out R.json [--rows 4 --max-new-tokens 128 --methods dspark@cost]

On the embedded target (fp32, CPU), in one process, the two settings interleaved:

- **target forward**: one sequence, a 300-token context, 1..8 new tokens (what a
  verification costs), and a batch of B sequences × 1 token after 128-token contexts (a
  plain batched decoding step); the median of three interleaved rounds of ``--repeats``.
- **decoding**: per prompt, plain decoding and each ``--methods`` entry with the product
  off and on (a drafter with ``@cost`` measures its step-cost table under its own setting);
  every greedy output must equal plain decoding's with the product off, token for token.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch


def _forward_ms(target, tokens: int, repeats: int, base: int) -> float:
    """One sequence: ``tokens`` new tokens after the ``base`` cached ones (cropped back after)."""
    times = []
    for _ in range(repeats):
        ids = torch.randint(100, 5000, (tokens,))
        t0 = time.perf_counter()
        step = target.forward(ids)
        _ = step.rows(-tokens)  # the verification reads every row's logits
        times.append(time.perf_counter() - t0)
        target.crop(base)
    return statistics.median(times) * 1000


def _batch_ms(model, cache, batch: int, repeats: int) -> float:
    """One plain batched decoding step: B sequences × 1 new token after the cached context."""
    times = []
    for _ in range(repeats):
        nxt = torch.randint(100, 5000, (batch, 1))
        t0 = time.perf_counter()
        model(input_ids=nxt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        times.append(time.perf_counter() - t0)
        cache.crop(-1)  # drop the token just added
    return statistics.median(times) * 1000


def run(out: Path, *, datasets: list[str], rows: int, max_new_tokens: int, methods: str, n: int, repeats: int) -> dict:
    from dspark.bench.provenance import finished, provenance, write_json
    from dspark.bench.speculative import Cell, parse_methods
    from dspark.datasets import load_prompts
    from dspark.decoding.factory import make_engine
    from dspark.decoding.sampling import SamplingParams
    from dspark.defaults import resolve_target
    from dspark.target import TargetModel
    from dspark.target.prompts import encode_prompt

    meta = provenance(0, datasets=datasets, rows=rows, max_new_tokens=max_new_tokens, methods=methods, n=n)
    target = TargetModel.from_pretrained(resolve_target(None))
    from transformers import DynamicCache

    settings = (False, True)
    forward = {s: {} for s in settings}
    batch = {s: {} for s in settings}
    with torch.inference_mode():
        target.reset()
        target.forward(torch.randint(100, 5000, (300,)))  # one sequence's context, kept
        base = target.cache_len
        caches = {}
        for b in (4, 16, 32):  # each batch's 128-token contexts, kept
            caches[b] = DynamicCache()
            target.model(input_ids=torch.randint(100, 5000, (b, 128)), past_key_values=caches[b], use_cache=True)
        for _ in range(3):  # interleaved rounds
            for s in settings:
                target.set_small_rows(s)
                for k in range(1, 9):
                    forward[s].setdefault(k, []).append(_forward_ms(target, k, repeats, base))
                for b, cache in caches.items():
                    batch[s].setdefault(b, []).append(_batch_ms(target.model, cache, b, repeats))
    target.reset()
    forward_ms = {("on" if s else "off"): {k: statistics.median(v) for k, v in forward[s].items()} for s in settings}
    batch_ms = {("on" if s else "off"): {b: statistics.median(v) for b, v in batch[s].items()} for s in settings}

    specs = [s for s in parse_methods(methods) if s.method != "baseline"]
    engines = {}
    for s in settings:  # a cost table is measured under the setting it will decode with
        target.set_small_rows(s)
        engines[("plain", s)] = make_engine(target, None, 0)
        for spec in specs:
            engines[(spec.label, s)] = make_engine(target, spec.drafting.build(target), n)
    params = SamplingParams(temperature=0.0)
    cells = {key: Cell() for key in engines}
    for name in datasets:
        for prompt in load_prompts(name, rows):
            ids = encode_prompt(target.tokenizer, prompt)
            reference = None
            for (label, s), engine in engines.items():
                target.set_small_rows(s)
                result = engine.generate(ids, max_new_tokens=max_new_tokens, params=params)
                if reference is None:
                    reference = result.tokens  # plain decoding, product off: the reference
                cells[(label, s)].add(result, reference)
    plain_off = cells[("plain", False)].tps
    decoding = [
        {
            "method": label,
            "small_rows": "on" if s else "off",
            "tok_per_s": cell.tps,
            "x_plain_off": cell.tps / plain_off,
            "accept_len": cell.emitted / cell.forwards if cell.forwards else 0.0,
            "drafts_per_step": cell.drafted / cell.forwards if cell.forwards else 0.0,
            "outputs_equal_plain_off": f"{cell.prompts - cell.mismatches}/{cell.prompts}",
        }
        for (label, s), cell in cells.items()
    ]
    report = {
        "provenance": finished(meta),
        "target_forward_ms_one_sequence_by_new_tokens": forward_ms,
        "plain_batch_step_ms_by_batch": batch_ms,
        "decoding": decoding,
    }
    write_json(out, report)
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--datasets", default="gsm8k,humaneval")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--methods", default="dspark@cost,dspark+ngram@cost")
    p.add_argument("--n", type=int, default=7)
    p.add_argument("--repeats", type=int, default=9)
    a = p.parse_args(argv)
    report = run(
        a.out,
        datasets=a.datasets.split(","),
        rows=a.rows,
        max_new_tokens=a.max_new_tokens,
        methods=a.methods,
        n=a.n,
        repeats=a.repeats,
    )
    f = report["target_forward_ms_one_sequence_by_new_tokens"]
    print("target forward ms by new tokens (off / on):")
    print("  " + "  ".join(f"{k}: {f['off'][k]:.0f}/{f['on'][k]:.0f}" for k in f["off"]))
    b = report["plain_batch_step_ms_by_batch"]
    steps = "  ".join(f"B={k}: {b['off'][k]:.0f}/{b['on'][k]:.0f}" for k in b["off"])
    print(f"plain batch step ms (off / on): {steps}")
    for row in report["decoding"]:
        print(
            f"{row['method']:>20} small rows {row['small_rows']:>3}: {row['tok_per_s']:.1f} tok/s "
            f"({row['x_plain_off']:.2f}x plain off), accept_len {row['accept_len']:.2f}, "
            f"drafts/step {row['drafts_per_step']:.2f}, outputs {row['outputs_equal_plain_off']}"
        )


if __name__ == "__main__":
    main()
