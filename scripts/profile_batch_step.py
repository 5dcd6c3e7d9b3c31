"""What a batched step costs on this machine, for the serving notes in docs/RESULTS.md.

    .venv/bin/python scripts/profile_batch_step.py [--slots 16] [--repeats 30]

1. The batch cost table `dspark serve --batch N --cost-model auto` measures at start-up
   (`measure_batch_cost`: whole engine steps of DSpark sequences, T(batch, tokens per
   sequence), drafting and capture included; plus one DSpark proposal alone).
2. The aux-layer capture a batch of drafters needs: ``slots`` sequences x 1 token over ~150
   cached tokens, with and without capturing layers 2, 15, 27, alternating ``repeats`` times.
Embedded target, fp32, 2 torch threads. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(2)
    from dspark.decoding.factory import make_drafter
    from dspark.decoding.step_timing import measure_batch_cost
    from dspark.defaults import default_draft_dir, resolve_target
    from dspark.target import TargetModel
    from dspark.target.slots import SlotDecoder

    target = TargetModel.from_pretrained(resolve_target(None))
    drafter = make_drafter("dspark", target, draft_dir=default_draft_dir("dspark"))
    capture = tuple(drafter.aux_layer_ids)
    decoder = SlotDecoder(target.model, slots=args.slots, max_len=512)
    cost = measure_batch_cost(decoder, max_width=8, drafter=drafter, capture=capture, context=128)
    table = {str(b): [round(t * 1000, 1) for t in row] for b, row in zip(cost.batches, cost.seconds, strict=True)}

    for slot in range(args.slots):
        decoder.prefill(slot, list(range(100, 250 + slot)))
    lengths = decoder.lengths.clone()
    times: dict[str, list[float]] = {"without_capture": [], "with_capture": []}
    for _ in range(args.repeats):
        for mode in ("without_capture", "with_capture"):
            t0 = time.perf_counter()
            decoder.extend([[5]] * args.slots, capture if mode == "with_capture" else ())
            times[mode].append(time.perf_counter() - t0)
            decoder.lengths.copy_(lengths)
    print(
        json.dumps(
            {
                "step_ms_by_batch_then_tokens_per_sequence_1_to_8": table,
                "draft_ms": round(cost.draft_seconds * 1000, 1),
                "capture_ab_ms_median": {m: round(statistics.median(v) * 1000, 1) for m, v in times.items()},
                "slots": args.slots,
                "repeats": args.repeats,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
