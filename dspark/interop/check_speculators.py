"""`dspark check speculators`: does speculators 0.9.0 (the format vLLM's ``dspark`` method reads)
load our exports and compute the same logits?

Builds a separate venv for it outside the repo (``$DSPARK_CACHE/venvs/speculators-0.9.0``:
speculators pins transformers <= 5.19, we need >= 5.20), then for seven tiny drafter variants
(six DSpark/DFlash, one EAGLE-3) and, when `dspark setup` has built the embedded target, the
three shipped drafters: exports the drafter and a fixture here (`speculators_parity` make),
and runs speculators' own model on it in that venv (`speculators_parity` check). Writes one
JSON object, variant -> report, and exits 1 if any variant fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from dspark.interop import speculators_parity

PINS = [
    "torch==2.13.0",
    "transformers==5.19.0",
    "pydantic>=2",
    "pydantic-settings",
    "safetensors",
    "loguru>=0.7.2,<=0.7.3",
    "numpy>=2,<2.5",
    "tqdm",
    "rich",
    "click",
    "typer",
    "httpx",
    "protobuf",
    "psutil",
    "openai",
    "aiohttp",
    "datasets>=4,<=5.1",
]
SHIPPED = {"default": "dspark", "default-dflash": "dflash", "default-eagle3": "eagle3"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ensure_venv(cache: Path) -> Path:
    """The speculators venv (built once): speculators and only what its model code imports
    (torchvision/torchaudio are declared but not imported; skipping them avoids a CUDA pull)."""
    venv = cache / "venvs" / "speculators-0.9.0"
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import speculators"]
    if py.is_file() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return py
    log(f"building {venv} (speculators 0.9.0 and only what its model code imports) ...")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *PINS], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "speculators==0.9.0", "hs-connectors==0.9.0"]
    subprocess.run(pip, check=True)
    return py


def main(argv: list[str] | None = None) -> None:
    from dspark.defaults import cache_root, default_draft_dir, default_target_dir

    parser = argparse.ArgumentParser(
        prog="dspark check speculators", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="docs/results/speculators-parity.json")
    parser.add_argument("--variants", help="comma list (default: every tiny variant and the shipped drafters)")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    args = parser.parse_args(argv)
    py = ensure_venv(cache_root())
    target = default_target_dir()
    names = args.variants.split(",") if args.variants else [*speculators_parity.TINY_VARIANTS, *SHIPPED]
    results, failed = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            work = Path(tmp) / name
            if name in SHIPPED:
                if not (target / "config.json").is_file():
                    log(f"skip {name} drafter: run 'dspark setup' first")
                    continue
                draft = ["--draft", str(default_draft_dir(SHIPPED[name])), "--target", str(target)]
            else:
                draft = ["--draft", name]
            speculators_parity.main(["make", *draft, "--work", str(work)])
            report = work.with_suffix(".json")
            check = [str(py), "-P", speculators_parity.__file__, "check", "--work", str(work), "--out", str(report)]
            done = subprocess.run(
                [*check, "--tolerance", str(args.tolerance)], capture_output=True, text=True, check=False
            )
            if done.returncode == 0:
                log(f"{name}: pass")
            else:
                failed.append(name)
                log(f"{name}: FAIL\n" + "\n".join(done.stderr.splitlines()[-5:]))
            if report.is_file():
                results[name] = json.loads(report.read_text())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=4) + "\n")
    log(f"wrote {args.out}")
    sys.exit(1 if failed else 0)
