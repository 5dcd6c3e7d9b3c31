"""What the deferred output head saves: every method with the target projecting all verified
positions to logits (the plain Hugging Face call) against projecting only the rows greedy
verification asks for (`TargetModel.defer_head`, the default). One process, the two modes
alternating prompt by prompt (order flipped each prompt), every output compared with plain
decoding of the same mode and across modes.

    .venv/bin/python scripts/bench_deferred_head.py [--rows 5] [--max-new-tokens 128] [--n 7]
        [--out docs/results/deferred-head-smollm2-cpu.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target")
    parser.add_argument("--datasets", default="gsm8k,humaneval")
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--n", type=int, default=7)
    parser.add_argument("--methods", default="dspark,dflash,eagle3")
    parser.add_argument("--out", default=str(REPO / "docs/results/deferred-head-smollm2-cpu.json"))
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tqdm import tqdm

    from dspark.bench.provenance import finished, provenance, write_json
    from dspark.datasets import load_prompts

    meta = provenance(  # before the run
        0,
        command="scripts/bench_deferred_head.py " + " ".join(sys.argv[1:]),
        max_new_tokens=args.max_new_tokens,
        rows=args.rows,
    )
    from dspark.decoding.factory import make_drafter, make_engine
    from dspark.decoding.sampling import SamplingParams
    from dspark.defaults import default_draft_dir, resolve_target
    from dspark.target import TargetModel
    from dspark.target.prompts import encode_prompt

    target = TargetModel.from_pretrained(resolve_target(args.target))
    methods = [m for m in args.methods.split(",") if m]
    engines = {"baseline": make_engine(target, None, 0)}
    for m in methods:
        drafter = make_drafter(m, target, draft_dir=default_draft_dir(m))
        engines[m] = make_engine(target, drafter, min(args.n, drafter.max_draft_tokens))
    modes = ("full", "deferred")
    params = SamplingParams()
    rows = []
    for dataset in args.datasets.split(","):
        prompts = load_prompts(dataset, args.rows)
        acc = {
            (mode, m): {"tokens": 0, "seconds": 0.0, "forwards": 0, "target_s": 0.0, "lossless": True}
            for mode in modes
            for m in engines
        }
        same_across_modes = True
        for i, prompt in enumerate(tqdm(prompts, desc=dataset, unit="prompt")):
            ids = encode_prompt(target.tokenizer, prompt)
            outputs = {}
            for mode in modes if i % 2 == 0 else modes[::-1]:
                target.defer_head = mode == "deferred"
                base = None
                for m, engine in engines.items():
                    res = engine.generate(ids, max_new_tokens=args.max_new_tokens, params=params)
                    a = acc[(mode, m)]
                    decoded = len(res.tokens) - 1
                    a["tokens"] += decoded
                    a["seconds"] += res.decode_seconds
                    a["forwards"] += res.target_forwards
                    a["target_s"] += res.timings["target"] + res.timings["verify"]
                    if m == "baseline":
                        base = res.tokens
                    else:
                        a["lossless"] &= res.tokens == base
                    outputs[(mode, m)] = res.tokens
            same_across_modes &= all(outputs[("full", m)] == outputs[("deferred", m)] for m in engines)
        for m in engines:
            row = {
                "dataset": dataset,
                "method": m,
                "n": 0 if m == "baseline" else args.n,
                "prompts": len(prompts),
                "same_output_both_modes": same_across_modes,
            }
            for mode in modes:
                a, b = acc[(mode, m)], acc[(mode, "baseline")]
                tps = a["tokens"] / a["seconds"]
                row[mode] = {
                    "tokens_per_second": tps,
                    "speedup": tps / (b["tokens"] / b["seconds"]),
                    "accept_len": a["tokens"] / a["forwards"],
                    "target_and_verify_ms_per_step": 1000 * a["target_s"] / a["forwards"],
                    "lossless": a["lossless"],
                }
            rows.append(row)
    target.defer_head = True
    header = (
        "| set | method | tok/s full → deferred | speedup full → deferred "
        "| target forward + verify, ms/step | lossless |"
    )
    lines = [header, "| --- | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        f, d = r["full"], r["deferred"]
        ok = f["lossless"] and d["lossless"] and r["same_output_both_modes"]
        lines.append(
            f"| {r['dataset']} | {r['method']} | {f['tokens_per_second']:.1f} → {d['tokens_per_second']:.1f} | "
            f"{f['speedup']:.2f}x → {d['speedup']:.2f}x | {f['target_and_verify_ms_per_step']:.1f} → "
            f"{d['target_and_verify_ms_per_step']:.1f} | {ok} |"
        )
    table = "\n".join(lines) + "\n"
    print(table)
    out = Path(args.out)
    write_json(
        out,
        {
            "provenance": finished(meta),
            "rows": rows,
        },
    )
    out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
