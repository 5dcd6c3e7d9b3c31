"""Three drafters from one pass of the target, against a feature cache first: one run.

    python -m dspark.bench.train_together --data train.jsonl --vocab vocab.safetensors --out R.json [--rows 96]

Both paths train the shipped recipes (recipes/smollm2-135m-{dspark,dflash,eagle3}.yaml) on
the same first ``--rows`` rows, one row a step, from cold processes, as
scripts/train_default_drafter.sh runs them:

- **cache**: `dspark cache-features` (the target in bf16, two single-thread workers), then the
  three recipes trained side by side, one single-thread process each, reading the cache;
- **together**: `dspark train --config A --config B --config C` with `source=online` and
  `target_dtype=bfloat16`: one target process streams each row's features to three
  single-thread trainer processes; nothing on disk.

Reports each path's wall time and tokens/s, the disk the cache took, and how far each
drafter of one path is from the other's (the features are the same bf16 target's, and a bf16
cache holds them exactly, so the drafters should agree to float rounding).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
METHODS = ("dspark", "dflash", "eagle3")


def _dspark(*args: str, log: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("a") as fh:
        proc = subprocess.run(
            [sys.executable, "-m", "dspark.cli", *args], stdout=fh, stderr=subprocess.STDOUT, env=env, check=False
        )
    if proc.returncode:
        raise RuntimeError(f"dspark {' '.join(args[:1])} failed (exit {proc.returncode}); see {log}")


def _sets(target: Path, data: Path, vocab: Path, out: Path, rows: int, extra: dict) -> list[str]:
    values = {
        "target": target,
        "data": data,
        "out": out,
        "drafter.vocab": vocab,
        "train.steps": rows,
        "train.checkpoint_every": rows,
        **extra,
    }
    return [arg for k, v in values.items() for arg in ("--set", f"{k}={v}")]


def _disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(target_dir: Path, data: Path, vocab: Path, out: Path, *, rows: int) -> dict:
    from safetensors.torch import load_file

    from dspark.bench.provenance import finished, provenance, write_json
    from dspark.training.data import load_examples, save_examples

    examples = load_examples(data, max_len=512)[:rows]
    tokens = sum(int(e.input_ids.numel()) for e in examples)
    meta = provenance(0, target=str(target_dir), data=str(data), rows=len(examples), tokens=tokens)
    work = Path(tempfile.mkdtemp(prefix="dspark-train-together-"))
    log = work / "log.txt"
    try:
        subset = save_examples(examples, work / "rows.jsonl")
        recipes = [str(REPO / "recipes" / f"smollm2-135m-{m}.yaml") for m in METHODS]
        paths = {}

        # Path 1: a feature cache, then three trainers reading it side by side.
        cache = work / "cache"
        t0 = time.perf_counter()
        _dspark(
            "cache-features", "--data", str(subset), "--out", str(cache), "--aux-layers", "2,15,27",
            "--seq-len", "512", "--target", str(target_dir), "--target-dtype", "bfloat16", "--workers", "2",
            log=log,
        )  # fmt: skip
        features = time.perf_counter() - t0
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = []
        for m, recipe in zip(METHODS, recipes, strict=True):
            sets = _sets(target_dir, subset, vocab, work / f"cache-{m}", rows, {"cache": cache})
            cmd = [sys.executable, "-m", "dspark.cli", "train", "--config", recipe, "--no-progress", *sets]
            procs.append(subprocess.Popen(cmd, stdout=log.open("a"), stderr=subprocess.STDOUT, env=env))
        if any(p.wait() for p in procs):
            raise RuntimeError(f"a cache-path trainer failed; see {log}")
        wall = time.perf_counter() - t0
        paths["cache"] = {
            "seconds": wall,
            "features_seconds": features,
            "tokens_per_second": tokens / wall,
            "disk_bytes": _disk(cache),
            "disk_bytes_per_token": _disk(cache) / tokens,
        }

        # Path 2: one target process streaming to three trainer processes.
        # `--set` applies to every --config, so each recipe's own out goes into a copy of it.
        per_recipe = work / "recipes"
        per_recipe.mkdir()
        configs = []
        for m, recipe in zip(METHODS, recipes, strict=True):
            raw = yaml.safe_load(Path(recipe).read_text())
            raw.update(
                target=str(target_dir),
                data=str(subset),
                out=str(work / f"together-{m}"),
                source="online",
                target_dtype="bfloat16",
            )
            raw.pop("cache", None)
            raw["drafter"]["vocab"] = str(vocab)
            raw["train"].update(steps=rows, checkpoint_every=rows)
            path = per_recipe / f"{m}.yaml"
            path.write_text(yaml.safe_dump(raw))
            configs += ["--config", str(path)]
        t0 = time.perf_counter()
        _dspark("train", *configs, "--no-progress", log=log)
        wall = time.perf_counter() - t0
        paths["together"] = {"seconds": wall, "tokens_per_second": tokens / wall, "disk_bytes": 0}

        agreement = {}
        for m in METHODS:
            a = load_file(str(work / f"cache-{m}" / "final" / "model.safetensors"))
            b = load_file(str(work / f"together-{m}" / "final" / "model.safetensors"))
            diffs = [float((a[k].float() - b[k].float()).abs().max()) for k in a]
            agreement[m] = {"tensors": len(a), "max_abs_weight_diff": max(diffs), "bitwise_equal": max(diffs) == 0.0}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "provenance": finished(meta),
        "paths": paths,
        "together_vs_cache_speed": paths["together"]["tokens_per_second"] / paths["cache"]["tokens_per_second"],
        "drafters_together_vs_cache": agreement,
    }
    write_json(out, report)
    return report


def main(argv: list[str] | None = None) -> None:
    from dspark.defaults import resolve_target

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="rows {input_ids, loss_mask} (dspark corpus export)")
    p.add_argument("--vocab", type=Path, required=True, help="draft vocab (dspark vocab) the recipes train with")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--target", type=Path, default=None, help="target directory (default: the embedded one)")
    p.add_argument("--rows", type=int, default=96)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    report = run(resolve_target(a.target), a.data.resolve(), a.vocab.resolve(), a.out, rows=a.rows)
    for name, r in report["paths"].items():
        mb = r["disk_bytes"] / 1e6
        print(f"{name}: {r['seconds']:.0f} s, {r['tokens_per_second']:.0f} tok/s, {mb:.0f} MB on disk")
    print(f"together / cache: {report['together_vs_cache_speed']:.2f}x")
    for m, r in report["drafters_together_vs_cache"].items():
        print(f"{m}: max |weight diff| {r['max_abs_weight_diff']:.2e}")


if __name__ == "__main__":
    main()
