"""A bounded load test of `dspark serve` on loopback; stops by itself.

For each mode (`--modes`: DSpark at a fixed draft length, DSpark with the cost-model draft
length, the same with prompt lookup first, plain decoding; a ``-batch`` mode serves with
continuous batching, ``--batch`` = the largest level) it starts a server (one after another,
each alone while it loads and measures its step cost), then runs 64 greedy chat requests at
1, 4 and 16 (``--levels``) concurrent clients, the modes taking turns at each level so that
the machine's drift falls on all of them alike; ``--rounds N`` repeats the sweep, every other
round in the reverse order of modes (tok/s is the mean over rounds; latencies pool them).
Servers run in ``dspark serve``'s default dtype (``auto``: bfloat16 on CPUs with AVX512-BF16 or
AMX); ``--dtypes float32,bfloat16`` serves every mode in each compute dtype (``mode/dtype``), all
in the one run. The first 1-client pass is a mode's sequential reference; every output at every
level and round must equal it, and every mode's sequential outputs must equal plain decoding's
in the same dtype and engine (a ``-batch`` mode: ``plain-batch``'s, when it runs).
Reports errors, p50 / p95 latency and total tok/s per level, and writes JSON (with
provenance) and markdown:

    .venv/bin/python scripts/load_test.py [--target DIR] [--draft DIR] [--requests 64] [--max-tokens 32] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, k: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        str(REPO / ".venv" / "bin" / "dspark"),
        "serve",
        "--port",
        str(port),
        "--num-speculative-tokens",
        str(k),
        "--max-concurrency",
        str(max(args.levels) + 4),
        *extra,
    ]
    if args.target:
        cmd += ["--target", args.target]
    if args.draft:
        cmd += ["--draft", args.draft]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("server did not start in 5 minutes")


def one(base: str, prompt: str, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    try:
        r = httpx.post(
            f"{base}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0},
            timeout=1800,
        )
    except httpx.HTTPError as exc:
        return {"error": repr(exc), "latency": time.perf_counter() - t0}
    latency = time.perf_counter() - t0
    if r.status_code != 200:
        return {"error": f"HTTP {r.status_code}: {r.text[:200]}", "latency": latency}
    body = r.json()
    return {
        "text": body["choices"][0]["message"]["content"],
        "tokens": body["usage"]["completion_tokens"],
        "accept_len": body["spec_decode"]["accept_len"],
        "latency": latency,
    }


def run_level(base: str, prompts: list[str], clients: int, max_tokens: int) -> tuple[list[dict], float]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        results = list(pool.map(lambda p: one(base, p, max_tokens), prompts))
    return results, time.perf_counter() - t0


BATCH_COUNTERS = ("dspark:batch_steps_total", "dspark:batch_sequence_steps_total", "dspark:batch_draft_tokens_total")


def counter(text: str, name: str) -> float:
    """The sum of a Prometheus counter's samples."""
    return sum(
        float(line.rsplit(" ", 1)[-1]) for line in text.splitlines() if line.startswith((name + "{", name + " "))
    )


def table_row(r: dict) -> str:
    batch = f" {r['mean_batch_size']:.1f} | {r['drafts_per_sequence_step']:.2f} |" if "mean_batch_size" in r else " | |"
    return (
        f"| {r['mode']} (k={r['num_speculative_tokens']}) | {r['clients']} | {r['requests']} | {r['errors']} | "
        f"{r['outputs_equal_to_sequential']}/{r['requests'] * r.get('rounds', 1)} | "
        f"{r.get('sequential_equal_to_plain', '—')}/{r['requests']} | "
        f"{r.get('sequential_equal_to_plain_batch', '—')}/{r['requests']} | {r['p50_latency_s']:.2f} | "
        f"{r['p95_latency_s']:.2f} | {r['tokens_per_second']:.1f} | {times_plain(r)} | "
        f"{r['mean_accept_len']:.2f} |" + batch
    )


def times_plain(r: dict) -> str:
    """``1.05× (1.07, 0.92)``: the row's tok/s over its plain mode's, over all rounds (rounds)."""
    if "times_plain" not in r:
        return "—"
    rounds = r["times_plain_per_round"]
    each = f" ({', '.join(f'{x:.2f}' for x in rounds)})" if len(rounds) > 1 else ""
    return f"{r['times_plain']:.2f}×{each}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16])
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=1, help="sweeps of every level and mode (modes alternate order)")
    parser.add_argument(
        "--modes",
        default="dspark,dspark-cost,plain",
        help="comma list of dspark, dspark-cost, dspark-cost-lookup (--prompt-lookup 3 too), plain; each with "
        "-batch for continuous batching",
    )
    parser.add_argument(
        "--dtypes",
        default="auto",
        help="comma list of compute dtypes (auto, float32, bfloat16); more than one serves every mode in each",
    )
    parser.add_argument("--out", default=str(REPO / "docs" / "results" / "serve-load-smollm2-cpu.json"))
    parser.add_argument("--markdown", default=str(REPO / "docs" / "results" / "serve-load-smollm2-cpu.md"))
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from dspark.bench.provenance import finished, provenance
    from dspark.datasets import load_prompts

    meta = {**provenance(seed=0), "command": " ".join(sys.argv)}  # before the run
    half = args.requests // 2
    prompts = load_prompts("gsm8k", half) + load_prompts("humaneval", args.requests - half)
    rows, failures = [], 0
    known = {
        "dspark": (args.k, ["--cost-model", "off"]),
        "dspark-cost": (args.k, ["--cost-model", "auto"]),
        "dspark-cost-lookup": (args.k, ["--cost-model", "auto", "--prompt-lookup", "3"]),
        "plain": (0, []),
    }
    batch = ["--batch", str(max(args.levels))]
    known.update({f"{name}-batch": (k, [*extra, *batch]) for name, (k, extra) in list(known.items())})
    known.update({name: (k, [*extra, "--batch", "1"]) for name, (k, extra) in known.items() if "-batch" not in name})
    modes = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in modes if m not in known]:
        raise SystemExit(f"unknown mode(s) {unknown}; choose from {sorted(known)}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    if bad := [d for d in dtypes if d not in ("auto", "float32", "bfloat16", "float16")]:
        raise SystemExit(f"unknown dtype(s) {bad}; choose from auto, float32, bfloat16, float16")
    if len(dtypes) > 1:  # every mode in each dtype; labels say which
        known = {f"{m}/{d}": (known[m][0], [*known[m][1], "--dtype", d]) for m in modes for d in dtypes}
        modes = [f"{m}/{d}" for d in dtypes for m in modes]
    else:
        known = {m: (k, [*extra, "--dtype", dtypes[0]]) for m, (k, extra) in known.items()}
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    served: dict[str, str] = {}  # mode -> the dtype its server computes in (/health; auto resolved)
    sequential: dict[str, list] = {}
    measured: dict[tuple[str, int], list[dict]] = {}  # (mode, clients) -> one entry per round
    try:
        for label in modes:  # one after another: each loads and measures its step cost alone
            servers[label] = start(args, known[label][0], known[label][1])
            served[label] = httpx.get(f"{servers[label][1]}/health", timeout=10).json()["dtype"]
        for rnd in range(args.rounds):
            order = modes if rnd % 2 == 0 else modes[::-1]
            for clients in args.levels:
                for label in order:
                    base = servers[label][1]
                    before = httpx.get(f"{base}/metrics", timeout=10).text
                    results, wall = run_level(base, prompts, clients, args.max_tokens)
                    after = httpx.get(f"{base}/metrics", timeout=10).text
                    batch = {n: counter(after, n) - counter(before, n) for n in BATCH_COUNTERS}
                    if label not in sequential:
                        sequential[label] = [r.get("text") for r in results]
                    entry = {"round": rnd, "results": results, "wall": wall, "batch": batch}
                    measured.setdefault((label, clients), []).append(entry)
                    ok = [r for r in results if "error" not in r]
                    print(
                        json.dumps(
                            {"round": rnd, "mode": label, "clients": clients, "errors": len(results) - len(ok)}
                            | {"tokens_per_second": sum(r["tokens"] for r in ok) / wall}
                        ),
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in servers.values():
            proc.wait(timeout=120)
    for label in modes:
        k = known[label][0]
        reference = sequential[label]
        for clients in args.levels:
            entries = measured[(label, clients)]
            results = [r for e in entries for r in e["results"]]
            errors = [r["error"] for r in results if "error" in r]
            ok = [r for r in results if "error" not in r]
            mismatches = sum(
                1 for e in entries for r, ref in zip(e["results"], reference, strict=True) if r.get("text") != ref
            )
            failures += len(errors) + mismatches
            lat = [r["latency"] for r in ok]
            per_round = [sum(r["tokens"] for r in e["results"] if "error" not in r) / e["wall"] for e in entries]
            row = {
                "mode": label,
                "num_speculative_tokens": k,
                "clients": clients,
                "requests": len(prompts),
                "rounds": len(entries),
                "errors": len(errors),
                "first_errors": errors[:3],
                "outputs_equal_to_sequential": len(results) - mismatches,
                "p50_latency_s": statistics.median(lat) if lat else None,
                "p95_latency_s": pct(lat, 0.95) if lat else None,
                "total_tokens": sum(r["tokens"] for r in ok),
                "wall_s": sum(e["wall"] for e in entries),
                "tokens_per_second": statistics.mean(per_round),
                "tokens_per_second_per_round": per_round,
                "mean_accept_len": statistics.mean(r["accept_len"] for r in ok) if ok else None,
            }
            steps = sum(e["batch"]["dspark:batch_steps_total"] for e in entries)
            if steps:
                seq_steps = sum(e["batch"]["dspark:batch_sequence_steps_total"] for e in entries)
                row["mean_batch_size"] = seq_steps / steps
                drafts = sum(e["batch"]["dspark:batch_draft_tokens_total"] for e in entries)
                row["drafts_per_sequence_step"] = drafts / seq_steps
            rows.append(row)
    # A batch mode must give what plain decoding in the batch engine gives (the same numerics;
    # the one-at-a-time engine's attention sums in another order, which bf16 rounding shows).
    for row in rows:
        name, _, dtype = row["mode"].partition("/")
        suffix = f"/{dtype}" if dtype else ""
        plain = sequential.get("plain" + suffix)
        plain_batch = sequential.get("plain-batch" + suffix)
        mine = sequential[row["mode"]]
        if plain is not None:
            row["sequential_equal_to_plain"] = sum(a == b for a, b in zip(mine, plain, strict=True))
        if plain_batch is not None and name.endswith("-batch"):
            row["sequential_equal_to_plain_batch"] = sum(a == b for a, b in zip(mine, plain_batch, strict=True))
        reference = plain_batch if plain_batch is not None and name.endswith("-batch") else plain
        # Throughput against the plain mode of the same engine at the same level, per round too:
        # the modes of a round ran next to each other, so a round's ratio is the fair one.
        base = next(
            (
                r
                for r in rows
                if r["clients"] == row["clients"]
                and r["mode"] == ("plain-batch" if name.endswith("-batch") else "plain") + suffix
            ),
            None,
        )
        if base is not None:
            row["times_plain"] = row["tokens_per_second"] / base["tokens_per_second"]
            pairs = zip(row["tokens_per_second_per_round"], base["tokens_per_second_per_round"], strict=True)
            row["times_plain_per_round"] = [a / b for a, b in pairs]
        if reference is not None and row["clients"] == args.levels[0]:
            failures += len(reference) - sum(a == b for a, b in zip(mine, reference, strict=True))
    result = {
        "provenance": finished(meta),
        "settings": {
            "requests": args.requests,
            "max_tokens": args.max_tokens,
            "dtypes": dtypes,
            "served_dtypes": served,
            "levels": args.levels,
            "rounds": args.rounds,
            "order": "servers started one by one; at each level the modes take turns, reversed every other round",
            "greedy": True,
            "endpoint": "/v1/chat/completions",
            "prompts": "gsm8k + humaneval, half each",
        },
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "| mode | clients | requests | errors | outputs == sequential | sequential == plain "
        "| sequential == plain batched | p50 latency (s) "
        "| p95 latency (s) | total tok/s | × plain (rounds) | mean accept_len | mean batch | drafts / sequence-step |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [table_row(r) for r in rows]
    lines += ["", f"Compute dtype (each server's /health): {', '.join(sorted(set(served.values())))}."]
    Path(args.markdown).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
