"""Batched decoding in process, methods interleaved round by round (one run, one machine state):
plain batched steps against DSpark with the load-aware draft length, its drafters drafting
together in one block forward (`propose_batch`) or one after another.

    .venv/bin/python scripts/batch_ab.py [--batch 16] [--requests N] [--rounds 3] [--max-tokens 64]
                                         [--dtype float32] [--fresh-table] [--out FILE.json]

Each round decodes the same ``--requests`` chat prompts (default ``--batch``; gsm8k + humaneval,
half each) to ``--max-tokens`` greedy tokens with every method, in a rotating order, ``--batch``
at a time (a request joins when one finishes, as in a server); every sequence's tokens must
equal plain decoding's. The batch's step cost is measured at start (`measure_batch_cost`, as
`dspark serve --batch N --cost-model auto` does), or anew before every round with
``--fresh-table`` (every round a server starting); each method gets its own load-aware rule
(new each round with ``--fresh-table``). Embedded target and DSpark drafter, 2 torch threads.
Prints and writes JSON: tok/s per round and the median, drafts per sequence-step, and the
trace of the rule's choices: per batch size (the table's nearest) and draft length ``k``, how
many steps, their mean measured milliseconds, the table's ``T(b, k + 1)`` and the rule's
estimate as it picked (the table corrected by the steps it had timed, `observe_step`).
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
    parser.add_argument("--requests", type=int, default=None, help="requests a round (default: --batch)")
    parser.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"))
    parser.add_argument("--fresh-table", action="store_true", help="measure the step cost anew every round")
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
    from dspark.devices import compute_dtype
    from dspark.target import TargetModel
    from dspark.target.prompts import encode_prompt
    from dspark.target.slots import SlotDecoder

    target = TargetModel.from_pretrained(resolve_target(None), dtype=compute_dtype(args.dtype))
    base = make_drafter("dspark", target, draft_dir=default_draft_dir("dspark"))
    capture = tuple(base.aux_layer_ids)
    requests = args.requests or args.batch
    half = requests // 2
    texts = load_prompts("gsm8k", half) + load_prompts("humaneval", requests - half)
    prompts = [encode_prompt(target.tokenizer, t) for t in texts]
    # Room for the prompts and answers, and for the step measurements (128 cached + ~110 new).
    decoder = SlotDecoder(
        target.model, slots=args.batch, max_len=max(max(map(len, prompts)) + args.max_tokens + args.k + 2, 256)
    )

    def measure():
        return measure_batch_cost(decoder, max_width=args.k + 1, drafter=base, capture=capture, context=128)

    cost = measure()
    tables = [cost]
    stops = target.stop_token_ids()
    methods = ("plain", "dspark-together", "dspark-alone")
    rules = {m: LoadAwareDraftLength(cost, args.k) for m in methods[1:]}
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    trace: dict[str, dict[tuple[int, int], list[float]]] = {m: {} for m in methods[1:]}
    reference: list[list[int]] | None = None
    for r in range(args.rounds):
        if args.fresh_table and r:
            cost = measure()
            tables.append(cost)
            rules = {m: LoadAwareDraftLength(cost, args.k) for m in methods[1:]}
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
            rule = rules.get(m)
            queue = list(reversed(seqs))
            t0 = time.perf_counter()
            while queue or engine.active:
                while queue and engine.free_slots:
                    engine.add(queue.pop())
                asked = len(rule.chosen) if rule else 0
                b = len(engine.active)
                # The rule's figures as it picks (its estimates move once the step is timed).
                before = [rule.step_seconds(b, k) for k in range(rule.max_drafts + 1)] if rule else []
                t = time.perf_counter()
                engine.step()
                if rule is not None and len(rule.chosen) > asked:  # the rule picked this step's length
                    key = (cost.nearest_batch(b), rule.chosen[-1])
                    cell = trace[m].setdefault(key, [0, 0.0, 0.0, 0.0])
                    cell[0] += 1
                    cell[1] += time.perf_counter() - t
                    cell[2] += cost.step_seconds(b, rule.chosen[-1] + 1)
                    cell[3] += before[rule.chosen[-1]]
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
        "requests": requests,
        "dtype": str(target.dtype).removeprefix("torch."),
        "fresh_table": args.fresh_table,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "k": args.k,
        "step_ms_by_batch_then_width": [
            {str(b): [round(t * 1000, 1) for t in table.seconds[i]] for i, b in enumerate(table.batches)}
            for table in tables
        ],
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
        if m in trace:  # the mean of each step's own figures (the tables and the estimates move)
            report["methods"][m]["rule_trace"] = [
                {
                    "batch": b,
                    "k": k,
                    "steps": n,
                    "measured_ms": round(1000 * t / n, 1),
                    "table_ms": round(1000 * table / n, 1),
                    "rule_estimate_ms": round(1000 * est / n, 1),
                }
                for (b, k), (n, t, table, est) in sorted(trace[m].items())
            ]
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
