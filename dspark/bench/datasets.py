"""Benchmark prompt sets: loaders over the JSONL files in ``../shared/data`` (or ``DSPARK_DATA``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dspark.errors import DSparkError

SPEC_BENCH_CATEGORIES = (
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)


def data_dir() -> Path:
    env = os.environ.get("DSPARK_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent.parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    return Path("../shared/data")


def _rows(name: str) -> list[dict]:
    path = data_dir() / f"{name}.jsonl"
    if not path.is_file():
        raise DSparkError(f"{path}: benchmark data not found (set DSPARK_DATA to the folder with the JSONL sets)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _humaneval(row: dict) -> str:
    return f"Complete the following Python function.\n\n```python\n{row['prompt']}```"


LOADERS = {
    "gsm8k": lambda: [r["question"] for r in _rows("gsm8k_test")],
    "math500": lambda: [r["problem"] for r in _rows("math500")],
    "aime24": lambda: [r["problem"] for r in _rows("aime24")],
    "humaneval": lambda: [_humaneval(r) for r in _rows("humaneval")],
    "spec_bench": lambda: [r["turns"][0] for r in _rows("spec_bench")],
}


def load_prompts(name: str, rows: int | None = None) -> list[str]:
    """Prompts of a dataset (``spec_bench/<category>`` selects one category), first ``rows``."""
    if name.startswith("spec_bench/"):
        category = name.split("/", 1)[1]
        if category not in SPEC_BENCH_CATEGORIES:
            raise DSparkError(
                f"unknown spec_bench category {category!r}; choose from {', '.join(SPEC_BENCH_CATEGORIES)}"
            )
        prompts = [r["turns"][0] for r in _rows("spec_bench") if r["category"] == category]
    elif name in LOADERS:
        prompts = LOADERS[name]()
    else:
        known = ", ".join([*LOADERS, "spec_bench/<category>"])
        raise DSparkError(f"unknown dataset {name!r}; choose from {known}")
    return prompts[:rows] if rows else prompts
