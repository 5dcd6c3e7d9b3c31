"""Batched decoding in process, methods interleaved round by round (one run, one machine state):
plain batched steps against DSpark with the load-aware draft length, its drafters drafting
together in one block forward (`propose_batch`) or one after another.

    .venv/bin/python scripts/batch_ab.py [--batch 16] [--rounds 3] [--max-tokens 64] [--out FILE.json]

Each round decodes the same ``--batch`` chat prompts (gsm8k + humaneval, half each) to
``--max-tokens`` greedy tokens with every method, in a rotating order; every sequence's
tokens must equal plain decoding's. The batch's step cost is measured once at start
(`measure_batch_cost`, as `dspark serve --batch N --cost-model auto` does); each method gets
its own load-aware rule. Embedded target and DSpark drafter, fp32, 2 torch threads.
Prints and writes JSON: tok/s per round and the median, drafts per sequence-step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    from dspark.bench.provenance import provenance
    from dspark.datasets import load_prompts
    from dspark.decoding.batch import BatchedEngine, Sequence
    from dspark.decoding.draft_length import LoadAwareDraftLength
    from dspark.decoding.drafters import fork_drafter
    from dspark.decoding.factory import make_drafter
    from dspark.decoding.step_timing import measure_batch_cost
    from dspark.defaults import default_draft_dir, resolve_target
    from dspark.target import TargetModel
    from dspark.target.prompts import encode_prompt
    from dspark.target.slots import SlotDecoder

    target = TargetModel.from_pretrained(resolve_target(None))
    base = make_drafter("dspark", target, draft_dir=default_draft_dir("dspark"))
    capture = tuple(base.aux_layer_ids)
    half = args.batch // 2
    texts = load_prompts("gsm8k", half) + load_prompts("humaneval", args.batch - half)
    prompts = [encode_prompt(target.tokenizer, t) for t in texts]
    # Room for the prompts and answers, and for the step measurements (128 cached + ~110 new).
    decoder = SlotDecoder(
        target.model, slots=args.batch, max_len=max(max(map(len, prompts)) + args.max_tokens + args.k + 2, 256)
    )
    cost = measure_batch_cost(decoder, max_width=args.k + 1, drafter=base, capture=capture, context=128)
    stops = target.stop_token_ids()
    methods = ("plain", "dspark-together", "dspark-alone")
    rules = {m: LoadAwareDraftLength(cost, args.k) for m in methods[1:]}
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    reference: list[list[int]] | None = None
    for r in range(args.rounds):
        for m in methods[r % 3 :] + methods[: r % 3]:
            drafting = m != "plain"
            engine = BatchedEngine(
                decoder,
                capture=capture if drafting else (),
                draft_length=rules.get(m),
                draft_together=m == "dspark-together",
            )
            seqs = [
                Sequence(
                    prompt=p,
                    max_new_tokens=args.max_tokens,
                    stop_ids=stops,
                    drafter=fork_drafter(base) if drafting else None,
                    num_speculative_tokens=args.k if drafting else 0,
                )
                for p in prompts
            ]
            steps = drafts = 0
            t0 = time.perf_counter()
            for seq in seqs:
                engine.add(seq)
            while engine.active:
                engine.step()
                steps += engine.last_step[0]
                drafts += engine.last_step[1]
            wall = time.perf_counter() - t0
            tokens = [s.tokens for s in seqs]
            if m == "plain" and reference is None:
                reference = tokens
            runs[m].append(
                {
                    "tok_per_s": sum(map(len, tokens)) / wall,
                    "wall_s": wall,
                    "drafts_per_sequence_step": drafts / max(1, steps),
                    "accept_len": statistics.mean(s.accept_len for s in seqs),
                    "tokens": tokens,
                }
            )
    report = {
        "batch": args.batch,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "k": args.k,
        "step_ms_by_batch_then_width": {
            str(b): [round(t * 1000, 1) for t in cost.seconds[i]] for i, b in enumerate(cost.batches)
        },
        "draft_ms_one_sequence": round(cost.draft_seconds * 1000, 1),
        "methods": {},
        "provenance": provenance(),
    }
    for m, rows in runs.items():
        report["methods"][m] = {
            "tok_per_s_median": round(statistics.median(x["tok_per_s"] for x in rows), 2),
            "tok_per_s_rounds": [round(x["tok_per_s"], 2) for x in rows],
            "drafts_per_sequence_step": [round(x["drafts_per_sequence_step"], 2) for x in rows],
            "accept_len_mean": [round(x["accept_len"], 3) for x in rows],
            "identical_to_plain": all(x["tokens"] == reference for x in rows),
        }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
