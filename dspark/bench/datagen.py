"""Datagen throughput, engine against engine, in one run: responses per minute, response
tokens per second, and how far each engine's greedy answers agree with the first engine's.

An engine is ``KIND/DTYPE/N``: ``generate/float32/32`` is `dspark datagen` as it was (Hugging
Face ``generate``, static batches of 32, fp32); ``slots/bfloat16/64`` is continuous batching
over 64 slots in bf16 (``slots/auto/64``: in bf16 where the CPU computes it natively, else
fp32); ``server/N`` is an OpenAI-compatible server (vLLM, `dspark serve`) at N requests in
flight, in its own dtype. Every engine answers the same prompts with the same
``max_new_tokens``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dspark.devices import dtype_name
from dspark.errors import DSparkError


@dataclass(frozen=True)
class EngineSpec:
    kind: str
    dtype: str
    size: int
    workers: int = 1  # `xW` suffix: W single-threaded worker processes, each with `size` slots or batch

    @property
    def label(self) -> str:
        if self.kind == "server":
            return f"server/{self.size}"
        return f"{self.kind}/{self.dtype}/{self.size}" + (f"x{self.workers}" if self.workers > 1 else "")


def parse_engines(text: str) -> list[EngineSpec]:
    specs = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        parts = item.split("/")
        if parts[0] == "server":
            if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) < 1:
                raise DSparkError(f"--engines {item!r}: expected server/N (N requests in flight)")
            specs.append(EngineSpec("server", "server", int(parts[1])))
            continue
        if len(parts) != 3 or parts[0] not in ("generate", "slots") or parts[1] not in ("auto", "float32", "bfloat16"):
            raise DSparkError(
                f"--engines {item!r}: expected KIND/DTYPE/N, KIND generate|slots, DTYPE auto|float32|bfloat16"
            )
        size_text, _, workers_text = parts[2].partition("x")
        try:
            size, workers = int(size_text), int(workers_text or 1)
        except ValueError:
            raise DSparkError(f"--engines {item!r}: N (or NxW) must be integers") from None
        if size < 1 or workers < 1:
            raise DSparkError(f"--engines {item!r}: N and W must be >= 1")
        specs.append(EngineSpec(parts[0], dtype_name(parts[1]), size, workers))  # auto: what it runs in here
    if not specs:
        raise DSparkError("--engines: name at least one engine")
    return specs


def agreement(reference: list[int], other: list[int]) -> tuple[bool, int]:
    """(identical, tokens before the first difference)."""
    n = 0
    for a, b in zip(reference, other, strict=False):
        if a != b:
            break
        n += 1
    return reference == other, n


def run_datagen_bench(
    target_dir,
    prompts: list,
    specs: list[EngineSpec],
    *,
    max_new_tokens: int,
    max_prompt_len: int = 1024,
    server: str | None = None,
    log=print,
) -> list[dict]:
    """``server``: the URL the ``server/N`` engines talk to."""
    from dspark.target import TargetModel
    from dspark.target.prompts import encode_prompt
    from dspark.training.datagen import GenerateEngine, ServerEngine, SlotEngine

    if any(spec.kind == "server" for spec in specs) and not server:
        raise DSparkError("a server/N engine needs --server URL")
    rows, reference = [], None
    for spec in specs:
        target = TargetModel.from_pretrained(target_dir, dtype=getattr(torch, spec.dtype, torch.float32))
        encoded = [encode_prompt(target.tokenizer, p) for p in prompts]
        longest = max(max_prompt_len, *map(len, encoded))
        if spec.workers > 1:
            from dspark.corpus.grow import Workers, parallel_answers

            kwargs = {"slots": spec.size, "batch_size": spec.size, "max_prompt_len": longest}
            workers = Workers(
                str(target_dir), spec.dtype, spec.workers, 1, spec.kind, {**kwargs, "max_new_tokens": max_new_tokens}
            )
            # Each worker takes every W-th prompt by length (one window each), as `corpus grow`
            # sorts its windows; the clock includes the workers' start-up.
            order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
            windows = [order[w :: spec.workers] for w in range(spec.workers)]
            log(f"{spec.label}: {len(encoded)} prompts ...")
            start = time.perf_counter()
            answers, names = {}, set()
            for w, k, response, name in parallel_answers(workers, [[encoded[i] for i in win] for win in windows]):
                answers[windows[w][k]] = response
                names.add(name)
            seconds = time.perf_counter() - start
            engine_name = ",".join(sorted(names))
        else:
            common = {"max_new_tokens": max_new_tokens}
            if spec.kind == "server":
                engine = ServerEngine(server, concurrency=spec.size, stop_ids=target.stop_token_ids(), **common)
            elif spec.kind == "slots":
                engine = SlotEngine(target, slots=spec.size, max_prompt_len=longest, **common)
            else:
                engine = GenerateEngine(target, batch_size=spec.size, **common)
            log(f"{spec.label}: {len(encoded)} prompts ...")
            start = time.perf_counter()
            answers = dict(engine.run(encoded))
            seconds = time.perf_counter() - start
            engine_name = engine.name
            del engine
        tokens = sum(len(a) for a in answers.values())
        row = {
            "engine": engine_name,
            "spec": spec.label,
            "workers": spec.workers,
            "prompts": len(encoded),
            "seconds": seconds,
            "responses_per_minute": len(encoded) / seconds * 60,
            "response_tokens": tokens,
            "tokens_per_second": tokens / seconds,
        }
        if reference is None:
            reference = answers
            row["reference"] = True
        else:
            same = [agreement(reference[i], answers[i]) for i in range(len(encoded))]
            row["identical_to_reference"] = sum(s for s, _ in same)
            ref_tokens = sum(len(reference[i]) for i in range(len(encoded)))
            row["token_agreement"] = sum(n for _, n in same) / ref_tokens if ref_tokens else 1.0
        rows.append(row)
        log(f"{spec.label}: {row['responses_per_minute']:.1f} responses/min, {row['tokens_per_second']:.0f} tok/s")
        del target
    base = rows[0]["responses_per_minute"]
    for row in rows:
        row["speedup"] = row["responses_per_minute"] / base
    return rows


def datagen_table(rows: list[dict]) -> str:
    lines = [
        "| engine | prompts | seconds | responses/min | tok/s | speedup | identical | token agreement |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        same = "reference" if r.get("reference") else f"{r['identical_to_reference']}/{r['prompts']}"
        agree = "" if r.get("reference") else f"{r['token_agreement']:.3f}"
        lines.append(
            f"| {r['spec']} | {r['prompts']} | {r['seconds']:.1f} | {r['responses_per_minute']:.1f} | "
            f"{r['tokens_per_second']:.0f} | {r['speedup']:.2f}x | {same} | {agree} |"
        )
    lines += [
        "",
        "speedup: responses per minute over the first engine's. identical: answers equal token for token to the "
        "first engine's; token agreement: the share of the first engine's tokens produced before the first "
        "difference (greedy answers of another dtype part at near-ties).",
    ]
    return "\n".join(lines) + "\n"
