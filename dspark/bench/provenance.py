"""Provenance recorded beside every benchmark result: commit, versions, machine, seed."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo; platform's processor string elsewhere): results
    from CPUs of one core count can differ several times over (bf16 native or emulated)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def provenance(seed: int | None = None, **extra) -> dict:
    """What produced a result: commit and cleanliness of the tree, versions, machine, seed.
    Take it *before* the work it describes (a commit made during a long run must not be
    credited with it); `finished` adds the end time when the result is written."""
    import torch
    import transformers

    from dspark.devices import native_bfloat16

    repo = Path(__file__).resolve().parents[2]
    try:
        commit = (
            subprocess.run(
                ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip()
            or None
        )
        dirty = bool(
            subprocess.run(
                ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
        )
    except OSError:
        commit, dirty = None, None
    if commit is None:
        # Not a git checkout (a copied tree): take the commit the copier names, cleanliness unknown.
        commit, dirty = os.environ.get("DSPARK_SOURCE_COMMIT") or None, None
    return {
        "commit": commit,
        "dirty": dirty,
        "time_utc": utc_now(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": platform.machine(),
        "processor": cpu_model(),
        "cpu_bfloat16_native": native_bfloat16("cpu"),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "seed": seed,
        **extra,
    }


def finished(meta: dict) -> dict:
    """Provenance taken before a run, with the time it ended."""
    return {**meta, "finished_utc": utc_now()}


def write_json(path: str | Path, data: dict) -> None:
    """Atomic write (temporary file + rename)."""
    from dspark.io import atomic_write_text

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(data, indent=2) + "\n")
