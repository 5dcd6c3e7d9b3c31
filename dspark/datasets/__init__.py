"""Prompt sets that ship inside the package: the benchmarks and the training prompt sources.

Each set is a gzip-compressed JSONL file beside this module (sources and licences in
``README.md`` here). ``DSPARK_DATA=DIR`` overrides a set with the user's own file:
``DIR/<file>.jsonl`` (or ``.jsonl.gz``) is read instead of the packaged copy when it exists.

Benchmark sets are held out from training: `training_prompts` refuses them.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
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


def _humaneval(row: dict) -> str:
    return f"Complete the following Python function.\n\n```python\n{row['prompt']}```"


@dataclass(frozen=True)
class PromptSet:
    name: str  # what the CLI calls it (`--datasets gsm8k`)
    file: str  # the JSONL file's stem
    kind: str  # "benchmark" (held out from training) or "training"
    prompt: Callable[[dict], str]  # one row -> the user turn


REGISTRY: dict[str, PromptSet] = {
    s.name: s
    for s in (
        PromptSet("gsm8k", "gsm8k_test", "benchmark", lambda r: r["question"]),
        PromptSet("math500", "math500", "benchmark", lambda r: r["problem"]),
        PromptSet("aime24", "aime24", "benchmark", lambda r: r["problem"]),
        PromptSet("humaneval", "humaneval", "benchmark", _humaneval),
        PromptSet("spec_bench", "spec_bench", "benchmark", lambda r: r["turns"][0]),
        PromptSet("gsm8k_train", "gsm8k_train", "training", lambda r: r["question"]),
    )
}
BENCHMARKS = tuple(name for name, s in REGISTRY.items() if s.kind == "benchmark")


def _read_jsonl(path: Path | resources.abc.Traversable, name: str) -> list[dict]:
    raw = path.read_bytes()
    if str(path).endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise DSparkError(f"{path}: not a readable gzip file ({e})") from e
    rows = []
    for i, line in enumerate(raw.decode("utf-8").split("\n"), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DSparkError(f"{path}:{i}: not JSON ({e.msg}) in the {name} set") from e
    return rows


def source_path(file: str) -> Path | resources.abc.Traversable:
    """Where a set's rows come from: the user's override under ``DSPARK_DATA``, else the package."""
    override = os.environ.get("DSPARK_DATA")
    if override:
        folder = Path(override)
        if not folder.is_dir():
            raise DSparkError(f"DSPARK_DATA={override}: no such folder")
        for candidate in (folder / f"{file}.jsonl", folder / f"{file}.jsonl.gz"):
            if candidate.is_file():
                return candidate
    packaged = resources.files(__name__) / f"{file}.jsonl.gz"
    if not packaged.is_file():
        raise DSparkError(f"{file}.jsonl.gz is missing from the installed dspark package (reinstall it)")
    return packaged


def read_rows(file: str) -> list[dict]:
    """The raw rows of a set's file (all fields)."""
    return _read_jsonl(source_path(file), file)


def load_prompts(name: str, rows: int | None = None) -> list[str]:
    """Prompts of a set (``spec_bench/<category>`` selects one category), the first ``rows``."""
    if name.startswith("spec_bench/"):
        category = name.split("/", 1)[1]
        if category not in SPEC_BENCH_CATEGORIES:
            raise DSparkError(
                f"unknown spec_bench category {category!r}; choose from {', '.join(SPEC_BENCH_CATEGORIES)}"
            )
        prompts = [r["turns"][0] for r in read_rows("spec_bench") if r["category"] == category]
    elif name in REGISTRY:
        spec = REGISTRY[name]
        prompts = [spec.prompt(r) for r in read_rows(spec.file)]
    else:
        known = ", ".join([*REGISTRY, "spec_bench/<category>"])
        raise DSparkError(f"unknown dataset {name!r}; choose from {known}")
    return prompts[:rows] if rows else prompts


def training_prompts(name: str, rows: int | None = None) -> list[str]:
    """Prompts of a training source; a benchmark set is refused (they stay held out)."""
    base = name.split("/", 1)[0]
    if base in REGISTRY and REGISTRY[base].kind == "benchmark":
        raise DSparkError(f"{name!r} is a benchmark set, held out from training")
    return load_prompts(name, rows)
