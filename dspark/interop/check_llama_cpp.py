"""llama.cpp runs our DSpark GGUF: the end-to-end check and the quantisation table.

1. Builds the llama.cpp vendored in the ``llama-cpp-python==0.3.36`` source distribution
   (CPU, cmake; cached under ``$DSPARK_CACHE/llama.cpp-0.3.36``, outside the repo).
2. Converts the reference target (the HF directory `dspark setup` built) to an f32 GGUF with
   llama.cpp's own ``convert_hf_to_gguf.py``.
3. Exports the drafter with ``dspark export --format gguf`` for each ``--types`` entry
   (K-quants through llama.cpp's ``llama-quantize`` from our f32 file).
4. For every prompt: plain decoding in llama.cpp (``llama-completion``), the draft in
   llama.cpp (``llama-speculative-simple --spec-type draft-dspark``, greedy), and the same
   GGUF read back into our engine (dequantised) next to our plain decoding; greedy texts are
   compared with ours, acceptance and tok/s recorded.

Writes JSON (with provenance) and a markdown table. Run it after `dspark setup`:

    dspark check llama-cpp --rows 2 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

DSPARK = [sys.executable, "-m", "dspark.cli"]  # the dspark command of this environment
SDIST = "llama_cpp_python-0.3.36.tar.gz"
PYTHON_WRITER_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)


# ---------------------------------------------------------------------------- build
def ensure_llama_cpp(cache: Path) -> tuple[Path, Path]:
    """(source dir, bin dir) of the vendored llama.cpp, downloaded and built once."""
    root = cache / "llama.cpp-0.3.36"
    src = root / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
    bin_dir = root / "build" / "bin"
    targets = ["llama-speculative-simple", "llama-completion", "llama-quantize"]
    if all((bin_dir / t).is_file() for t in targets):
        return src, bin_dir
    root.mkdir(parents=True, exist_ok=True)
    if not src.is_dir():
        index = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/", timeout=60).read().decode()
        url = re.search(r'href="([^"]*' + re.escape(SDIST) + r')[^"]*"', index)
        if not url:
            raise SystemExit(f"{SDIST} not found on the package index")
        log(f"downloading {SDIST} ...")
        archive = root / SDIST
        urllib.request.urlretrieve(url.group(1).split("#")[0], archive)
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
    build = root / "build"
    log("building llama.cpp (CPU; ~15 min on 2 cores, once) ...")
    cfg = run(
        [
            "cmake",
            "-S",
            str(src),
            "-B",
            str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_OPENSSL=OFF",
        ]
    )
    if cfg.returncode:
        raise SystemExit(f"cmake configure failed:\n{cfg.stderr[-2000:]}")
    out = run(["cmake", "--build", str(build), "-j", "2", "--target", *targets])
    if out.returncode:
        raise SystemExit(f"cmake build failed:\n{out.stderr[-2000:]}")
    return src, bin_dir


def ensure_target_gguf(src: Path, target_dir: Path, cache: Path) -> Path:
    out = cache / "llama.cpp-0.3.36" / f"{target_dir.name}-f32.gguf"
    if out.is_file():
        return out
    try:
        import sentencepiece  # noqa: F401 - the converter imports it even for BPE tokenizers
    except ImportError:
        run([sys.executable, "-m", "pip", "install", "-q", "sentencepiece"])
    log(f"converting {target_dir} with llama.cpp's convert_hf_to_gguf.py (f32) ...")
    env = {"PYTHONPATH": str(src / "gguf-py"), "PATH": "/usr/bin:/bin"}
    proc = run(
        [
            sys.executable,
            str(src / "convert_hf_to_gguf.py"),
            str(target_dir),
            "--outtype",
            "f32",
            "--outfile",
            str(out),
        ],
        env=env,
    )
    if proc.returncode:
        raise SystemExit(f"target conversion failed:\n{proc.stderr[-3000:]}")
    return out


def export_drafts(draft: Path, target_dir: Path, target_gguf: Path, types: list[str], bin_dir: Path, work: Path):
    paths = {}
    for kind in types:
        out = work / f"draft-{kind}.gguf"
        if kind in PYTHON_WRITER_TYPES:
            proc = run(
                [
                    *DSPARK,
                    "export",
                    str(draft),
                    "--format",
                    "gguf",
                    "--outtype",
                    kind,
                    "--out",
                    str(out),
                    "--target",
                    str(target_dir),
                    "--tokenizer-from",
                    str(target_gguf),
                    "--force",
                ]
            )
        else:  # K-quants: llama.cpp's quantiser from our f32 file
            base = work / "draft-f32.gguf"
            if not base.is_file():
                export_drafts(draft, target_dir, target_gguf, ["f32"], bin_dir, work)
            proc = run([str(bin_dir / "llama-quantize"), str(base), str(out), kind.upper()])
        if proc.returncode:
            raise SystemExit(f"export {kind} failed:\n{proc.stderr[-2000:]}")
        paths[kind] = out
    return paths


# ---------------------------------------------------------------------------- llama.cpp runs
def same_greedy_text(a: str | None, b: str) -> bool:
    """Equal up to the shorter one (llama.cpp may emit one token more than asked)."""
    if not a or not b:
        return False
    return a.startswith(b) or b.startswith(a)


def _generated(stdout: str, prompt: str) -> str:
    """The generated text: what follows the echoed prompt (echoed with or without special tokens)."""
    at, length = stdout.find(prompt), len(prompt)
    if at < 0:  # llama-completion echoes the prompt without its special tokens
        bare = re.sub(r"<\|[^|>]*\|>", "", prompt)
        at, length = stdout.find(bare), len(bare)
    text = stdout[at + length :] if at >= 0 else stdout
    return text.rstrip("\n").removesuffix("[end of text]").rstrip()


def llama_spec(bin_dir: Path, target: Path, draft: Path, prompt_file: Path, prompt: str, n: int, k: int, threads: int):
    proc = run(
        [
            str(bin_dir / "llama-speculative-simple"),
            "-m",
            str(target),
            "-md",
            str(draft),
            "--spec-type",
            "draft-dspark",
            "--spec-draft-n-max",
            str(k),
            "-f",
            str(prompt_file),
            "-n",
            str(n),
            "--temp",
            "0",
            "-t",
            str(threads),
            "-c",
            "4096",
        ]
    )
    if proc.returncode:
        return {"error": proc.stderr[-1500:]}
    err = proc.stderr
    decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", err)
    drafted = int(re.search(r"n_drafted = (\d+)", err).group(1))
    accepted = int(re.search(r"n_accept  = (\d+)", err).group(1))
    steps = -(-drafted // k) if drafted else 0
    return {
        "text": _generated(proc.stdout, prompt),
        "tokens": int(decoded.group(1)),
        "seconds": float(decoded.group(2)),
        "tokens_per_second": int(decoded.group(1)) / float(decoded.group(2)),
        "verify_steps": steps,
        "accepted": accepted,
        "accept_len": (accepted + steps) / steps if steps else None,
    }


def llama_plain(bin_dir: Path, target: Path, prompt_file: Path, prompt: str, n: int, threads: int):
    proc = run(
        [
            str(bin_dir / "llama-completion"),
            "-m",
            str(target),
            "-f",
            str(prompt_file),
            "-n",
            str(n),
            "--temp",
            "0",
            "-t",
            str(threads),
            "-c",
            "4096",
            "-no-cnv",
            "--no-warmup",
        ]
    )
    if proc.returncode:
        return {"error": proc.stderr[-1500:]}
    m = re.search(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs", proc.stderr)
    ms, runs = float(m.group(1)), int(m.group(2))
    return {"text": _generated(proc.stdout, prompt), "tokens_per_second": runs / (ms / 1000.0) if ms else None}


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    from dspark.defaults import default_draft_dir

    parser = argparse.ArgumentParser(
        prog="dspark check llama-cpp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--draft", default=str(default_draft_dir("dspark")))
    parser.add_argument("--target", default=None, help="target HF directory (default: the embedded one)")
    parser.add_argument("--datasets", default="gsm8k,humaneval")
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=7, help="num speculative tokens")
    parser.add_argument("--types", default="f32,f16,q8_0,q5_0,q4_0,q4_k_m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="docs/results/llama-cpp-smollm2-cpu.json")
    parser.add_argument("--markdown", default="docs/results/llama-cpp-smollm2-cpu.md")
    args = parser.parse_args(argv)

    import torch

    from dspark.bench.provenance import finished, provenance
    from dspark.datasets import load_prompts
    from dspark.decoding.factory import make_drafter, make_engine
    from dspark.defaults import cache_root, resolve_target
    from dspark.target import TargetModel

    torch.set_num_threads(args.threads)
    started = provenance(seed=0)  # before the run (after the thread count it records)
    cache = cache_root()
    target_dir = resolve_target(args.target)
    src, bin_dir = ensure_llama_cpp(cache)
    target_gguf = ensure_target_gguf(src, target_dir, cache)
    work = cache / "llama.cpp-0.3.36" / "drafts"
    work.mkdir(parents=True, exist_ok=True)
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    drafts = export_drafts(Path(args.draft), target_dir, target_gguf, types, bin_dir, work)

    target = TargetModel.from_pretrained(target_dir)
    tok = target.tokenizer
    ours_by_type = {
        kind: make_engine(target, make_drafter("dspark", target, draft_dir=path), args.k)
        for kind, path in drafts.items()
    }
    plain = make_engine(target, None, None)
    prompts = [(ds, p) for ds in args.datasets.split(",") for p in load_prompts(ds, args.rows)]
    rows = []
    for i, (ds, prompt) in enumerate(prompts):
        text = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        prompt_file = work / f"prompt-{i}.txt"
        prompt_file.write_text(text)
        base = plain.generate(ids, max_new_tokens=args.max_new_tokens)
        ours_text = tok.decode(base.tokens, skip_special_tokens=False).removesuffix("<|im_end|>").rstrip()
        lc_plain = llama_plain(bin_dir, target_gguf, prompt_file, text, args.max_new_tokens, args.threads)
        log(
            f"[{i + 1}/{len(prompts)}] {ds}: plain ours {base.tokens_per_second:.1f} tok/s, "
            f"llama.cpp {lc_plain.get('tokens_per_second')}"
        )
        row = {
            "dataset": ds,
            "prompt_index": i,
            "ours_plain_tokens_per_second": base.tokens_per_second,
            "llama_plain_tokens_per_second": lc_plain.get("tokens_per_second"),
            "llama_plain_identical_to_ours": same_greedy_text(lc_plain.get("text"), ours_text),
            "types": {},
        }
        for kind, path in drafts.items():
            res = ours_by_type[kind].generate(ids, max_new_tokens=args.max_new_tokens)
            lc = llama_spec(bin_dir, target_gguf, path, prompt_file, text, args.max_new_tokens, args.k, args.threads)
            row["types"][kind] = {
                "ours_accept_len": res.accept_len,
                "ours_tokens_per_second": res.tokens_per_second,
                "ours_lossless": res.tokens == base.tokens,
                "llama_accept_len": lc.get("accept_len"),
                "llama_tokens_per_second": lc.get("tokens_per_second"),
                "llama_identical_to_ours": same_greedy_text(lc.get("text"), ours_text),
                # llama.cpp's own losslessness: its speculative text against its plain decoding
                "llama_identical_to_llama_plain": same_greedy_text(lc.get("text"), lc_plain.get("text") or ""),
                "llama_error": lc.get("error"),
            }
            log(
                f"    {kind}: ours tau {res.accept_len:.3f}, llama.cpp tau {lc.get('accept_len')}, "
                f"identical {same_greedy_text(lc.get('text'), ours_text)}"
            )
        rows.append(row)

    table = []
    for kind, path in drafts.items():
        per = [r["types"][kind] for r in rows]

        def med(key: str, per=per) -> float:
            return statistics.median([p[key] for p in per if p[key] is not None])

        table.append(
            {
                "type": kind,
                "bytes": path.stat().st_size,
                "ours_accept_len": statistics.mean(p["ours_accept_len"] for p in per),
                "llama_accept_len": statistics.mean(p["llama_accept_len"] for p in per if p["llama_accept_len"]),
                "ours_speedup_median": statistics.median(
                    p["ours_tokens_per_second"] / r["ours_plain_tokens_per_second"]
                    for p, r in zip(per, rows, strict=True)
                ),
                "llama_speedup_median": statistics.median(
                    p["llama_tokens_per_second"] / r["llama_plain_tokens_per_second"]
                    for p, r in zip(per, rows, strict=True)
                ),
                "ours_tokens_per_second_median": med("ours_tokens_per_second"),
                "llama_tokens_per_second_median": med("llama_tokens_per_second"),
                "ours_lossless_all": all(p["ours_lossless"] for p in per),
                "llama_identical_to_ours": sum(p["llama_identical_to_ours"] for p in per),
                "llama_identical_to_llama_plain": sum(p["llama_identical_to_llama_plain"] for p in per),
                "prompts": len(per),
            }
        )
    result = {
        "provenance": {
            **finished(started),
            "llama_cpp": "vendored in llama-cpp-python==0.3.36, CPU build",
            "target_gguf": target_gguf.name,
            "command": " ".join(sys.argv),
        },
        "settings": {
            "rows": args.rows,
            "datasets": args.datasets,
            "max_new_tokens": args.max_new_tokens,
            "k": args.k,
            "threads": args.threads,
            "greedy": True,
        },
        "plain": {
            "ours_tokens_per_second_median": statistics.median(r["ours_plain_tokens_per_second"] for r in rows),
            "llama_tokens_per_second_median": statistics.median(r["llama_plain_tokens_per_second"] for r in rows),
            "llama_plain_identical_to_ours": sum(r["llama_plain_identical_to_ours"] for r in rows),
        },
        "table": table,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"Greedy, n={args.k}, {len(rows)} prompts ({args.datasets}, {args.rows} each), "
        f"{args.max_new_tokens} new tokens, "
        f"{args.threads} threads. Plain decoding: ours {result['plain']['ours_tokens_per_second_median']:.1f} tok/s, "
        f"llama.cpp (f32 target) {result['plain']['llama_tokens_per_second_median']:.1f} tok/s (medians).",
        "",
        "| drafter GGUF | size (MB) | accept_len ours | accept_len llama.cpp | speedup ours | speedup llama.cpp "
        "| tok/s ours | tok/s llama.cpp | ours lossless | llama.cpp lossless | llama.cpp text == ours |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for t in table:
        lines.append(
            f"| {t['type']} | {t['bytes'] / 1e6:.1f} | {t['ours_accept_len']:.3f} | {t['llama_accept_len']:.3f} | "
            f"{t['ours_speedup_median']:.2f}x | {t['llama_speedup_median']:.2f}x | "
            f"{t['ours_tokens_per_second_median']:.1f} | "
            f"{t['llama_tokens_per_second_median']:.1f} | {'yes' if t['ours_lossless_all'] else 'NO'} | "
            f"{t['llama_identical_to_llama_plain']}/{t['prompts']} | {t['llama_identical_to_ours']}/{t['prompts']} |"
        )
    Path(args.markdown).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
