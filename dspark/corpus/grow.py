"""Grow a corpus: answer the pool's prompts not yet stored, and pack the answers into shards.

Answers go first to a work file beside nothing in the repo (``--work``, JSONL, appended
row by row, so a kill loses at most the rows in flight); every ``shard_rows`` answers become
one new shard of the corpus and leave the work file. ``limit=0`` only packs what the work
file holds (after a killed run). A prompt already in the corpus or in the work file is
never answered twice.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dspark.corpus import Corpus, Row, prompt_key
from dspark.errors import DSparkError
from dspark.io import atomic_write_text, sha256_file
from dspark.target.prompts import encode_prompt
from dspark.training.datagen import GenerateEngine, ServerEngine, read_rows_resumable


def read_pool(path: str | Path) -> list[dict]:
    src = Path(path)
    if not src.is_file():
        raise DSparkError(f"{src}: prompt pool not found (build one with `dspark corpus prompts`)")
    pool = []
    for n, line in enumerate(src.read_text().split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            pool.append(
                {"prompt": row["prompt"], "source": str(row["source"]), "source_index": int(row["source_index"])}
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise DSparkError(f"{src}:{n}: expected {{prompt, source, source_index}} ({exc})") from None
    return pool


def tokenizer_checksum(target_dir: str | Path) -> str:
    path = Path(target_dir) / "tokenizer.json"
    if not path.is_file():
        raise DSparkError(f"{target_dir}: no tokenizer.json; a corpus records the tokenizer its ids belong to")
    return sha256_file(path)


def pack_work(corpus: Corpus, work: Path, rows: list[dict], meta: Callable[[], dict]) -> int:
    """Move ``rows`` (work-file dicts) into one new shard; the work file keeps the rest."""
    stored = corpus.keys()
    fresh, seen = [], set()
    for r in rows:
        if r["key"] in stored or r["key"] in seen:
            continue
        seen.add(r["key"])
        fresh.append(Row(r["input_ids"], r["loss_mask"], r["source"], int(r["source_index"]), r["key"], r["engine"]))
    if fresh:
        corpus.append(fresh, **meta())
    packed = {r["key"] for r in rows}
    rest = [r for r in read_rows_resumable(work) if r.get("key") not in packed]
    atomic_write_text(work, "".join(json.dumps(r) + "\n" for r in rest))
    return len(fresh)


@dataclass(frozen=True)
class Workers:
    """Answer in ``count`` worker processes of ``threads`` torch threads each, every one with its
    own engine (``make_engine(kind, ...)`` over the target at ``target_dir`` in ``dtype``). On a
    CPU, two single-threaded workers answer ~1.4x what one two-threaded process does."""

    target_dir: str
    dtype: str
    count: int
    threads: int = 1
    kind: str = "auto"
    engine_kwargs: dict | None = None


def _worker(spec: Workers, windows: list[tuple[int, list[list[int]]]], queue) -> None:
    try:
        import torch

        from dspark.target import TargetModel
        from dspark.training.datagen import make_engine

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
        torch.set_num_threads(spec.threads)
        target = TargetModel.from_pretrained(spec.target_dir, dtype=getattr(torch, spec.dtype))
        engine = make_engine(spec.kind, target, **(spec.engine_kwargs or {}))
        for index, prompts in windows:
            for k, response in engine.run(prompts):
                queue.put(("row", index, k, response, engine.name))
        queue.put(("done",))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


def parallel_answers(spec: Workers, windows: list[list[list[int]]]) -> Iterator[tuple[int, int, list[int], str]]:
    """``(window, index in window, response, engine name)`` from ``spec.count`` workers, each
    taking every count-th window; the workers stop when the generator is closed."""
    import multiprocessing as mp
    from queue import Empty

    ctx = mp.get_context("spawn")
    queue = ctx.Queue(maxsize=4096)
    procs = []
    for w in range(spec.count):
        mine = [(i, windows[i]) for i in range(w, len(windows), spec.count)]
        proc = ctx.Process(target=_worker, args=(spec, mine, queue), daemon=True)
        proc.start()
        procs.append(proc)
    running = spec.count
    try:
        while running:
            try:
                msg = queue.get(timeout=5)
            except Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise DSparkError(f"a datagen worker died (exit code {dead[0]})") from None
                continue
            if msg[0] == "row":
                yield msg[1], msg[2], msg[3], msg[4]
            elif msg[0] == "done":
                running -= 1
            else:
                raise DSparkError(f"a datagen worker failed: {msg[1]}")
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=30)
        queue.close()
        queue.join_thread()


def grow(
    corpus: Corpus,
    pool: list[dict],
    engine: GenerateEngine | ServerEngine | Workers,
    *,
    work: str | Path,
    limit: int | None,
    shard_rows: int,
    meta: Callable[[], dict],
    tokenizer=None,
    max_prompt_len: int | None = None,
    exclude: set[str] | frozenset[str] = frozenset(),
    progress: bool = True,
    log=print,
) -> dict:
    """Answer up to ``limit`` new prompts of ``pool`` (all when None) with ``engine`` (in this
    process) or `Workers`; returns counts. Prompts whose key is in ``exclude`` (the rows of
    another corpus) count as answered. SIGTERM / Ctrl-C stop it cleanly: the answers so far
    are packed first."""
    from tqdm import tqdm

    work = Path(work)
    work.parent.mkdir(parents=True, exist_ok=True)
    pending = [r for r in read_rows_resumable(work) if "key" in r]
    stored = corpus.keys()
    taken = stored | {r["key"] for r in pending} | set(exclude)
    todo = [p for p in pool if prompt_key(p["prompt"]) not in taken]
    counts = {"stored_before": len(stored), "pending_before": len(pending), "answered": 0, "packed": 0}
    if len(pending) >= shard_rows or (limit == 0 and pending) or (not todo and pending):
        counts["packed"] += pack_work(corpus, work, pending, meta)
        pending = []
    if not todo or limit == 0:
        return counts

    stop = {"now": False}

    def on_term(signum, frame):  # finish the row in hand, pack, exit
        stop["now"] = True

    previous = signal.signal(signal.SIGTERM, on_term)
    in_process = not isinstance(engine, Workers)
    tok = tokenizer if tokenizer is not None else engine.target.tokenizer
    limit_len = max_prompt_len if max_prompt_len is not None else getattr(engine, "max_prompt_len", None)
    encoded, kept, left_out = [], [], 0
    for p in todo:  # the first `limit` prompts that fit (a prompt too long does not count)
        if limit is not None and len(kept) >= limit:
            break
        ids = encode_prompt(tok, p["prompt"])
        if ids and (limit_len is None or len(ids) <= limit_len):
            encoded.append(ids)
            kept.append(p)
        else:
            left_out += 1
    if left_out:
        log(f"note: {left_out} prompts longer than {limit_len} tokens (or empty) were left out")
    # Windows of shard_rows prompts, each sorted by length: sequences decoding together then
    # have similar spans (attention reads every slot up to the longest), while every shard
    # still holds the pool's mix of sources.
    windows = [
        sorted(range(start, min(start + shard_rows, len(kept))), key=lambda i: len(encoded[i]))
        for start in range(0, len(kept), shard_rows)
    ]
    prompts = [[encoded[i] for i in w] for w in windows]
    if in_process:
        stream = ((w, k, r, engine.name) for w, batch in enumerate(prompts) for k, r in engine.run(batch))
    else:
        stream = parallel_answers(engine, prompts)
    bar = tqdm(total=len(kept), desc="corpus", disable=not progress, unit="row")
    tokens = 0
    try:
        for w, k, response, name in stream:
            p, ids = kept[windows[w][k]], encoded[windows[w][k]]
            row = {
                "key": prompt_key(p["prompt"]),
                "source": p["source"],
                "source_index": p["source_index"],
                "input_ids": ids + response,
                "loss_mask": [0] * len(ids) + [1] * len(response),
                "engine": name,
            }
            # Opened per row: packing a shard replaces the work file, and a handle kept open
            # would go on writing to the replaced one.
            with work.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            pending.append(row)
            counts["answered"] += 1
            tokens += len(response)
            bar.update(1)
            bar.set_postfix_str(f"{tokens / max(bar.format_dict['elapsed'], 1e-9):.0f} tok/s", refresh=False)
            if len(pending) >= shard_rows:
                counts["packed"] += pack_work(corpus, work, pending, meta)
                pending = []
            if stop["now"]:
                break
    except KeyboardInterrupt:
        log("interrupted: packing the answers so far")
        stop["now"] = True
    finally:
        if hasattr(stream, "close"):
            stream.close()
        bar.close()
        signal.signal(signal.SIGTERM, previous)
    if pending:
        counts["packed"] += pack_work(corpus, work, pending, meta)
    counts["response_tokens"] = tokens
    counts["stopped"] = stop["now"]  # by SIGTERM or Ctrl-C, before the prompts ran out
    return counts
