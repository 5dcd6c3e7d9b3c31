"""Training examples and the hidden-state sources that turn them into target features.

An example is a tokenized conversation: ``input_ids`` and a ``loss_mask`` that is True on
assistant tokens. A source yields, in a fixed order from any start index, the example
plus the target's aux-layer hidden states and its final normed hidden state (which the
drafter's frozen lm_head turns into the target's logits over the draft vocab).

Sources: `InProcessSource` runs the target in the trainer's process; `OnlineSource` runs
it in worker processes that stream features into bounded queues.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.errors import DSparkError


@dataclass
class Example:
    input_ids: torch.Tensor  # [T] long
    loss_mask: torch.Tensor  # [T] bool


@dataclass
class FeatureBatch:
    index: int  # position in the example order
    input_ids: torch.Tensor  # [T]
    loss_mask: torch.Tensor  # [T] bool
    document_ids: torch.Tensor  # [T]
    aux_hidden: torch.Tensor  # [T, m·H]
    last_hidden: torch.Tensor  # [T, H] final normed target state


def load_examples(path: str | Path, *, max_len: int | None = None) -> list[Example]:
    """Read JSONL rows ``{"input_ids": [...], "loss_mask": [...]}`` (clear error per bad line),
    or every row of a corpus directory (`dspark.corpus`, one with a manifest.json)."""
    src = Path(path)
    if src.is_dir() and (src / "manifest.json").is_file():
        from dspark.corpus import Corpus

        out = [
            Example(
                torch.tensor(r.input_ids[:max_len], dtype=torch.long),
                torch.tensor(r.loss_mask[:max_len], dtype=torch.bool),
            )
            for r in Corpus(src).iter_rows()
        ]
        if not out:
            raise DSparkError(f"{src}: the corpus holds no rows")
        return out
    if not src.is_file():
        raise DSparkError(f"{src}: training data file not found")
    out = []
    with src.open() as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                ids, mask = row["input_ids"], row["loss_mask"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise DSparkError(f"{src}:{n}: expected JSON with input_ids and loss_mask ({exc})") from None
            if len(ids) != len(mask):
                raise DSparkError(f"{src}:{n}: input_ids and loss_mask differ in length")
            if len(ids) < 2:
                raise DSparkError(f"{src}:{n}: an example needs at least 2 tokens, got {len(ids)}")
            if max_len:
                ids, mask = ids[:max_len], mask[:max_len]
            out.append(Example(torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)))
    if not out:
        raise DSparkError(f"{src}: no training examples")
    return out


def save_examples(examples: list[Example], path: str | Path) -> Path:
    """Write examples as the JSONL rows `load_examples` reads (a subset for a benchmark, say)."""
    out = Path(path)
    out.write_text(
        "".join(
            json.dumps({"input_ids": e.input_ids.tolist(), "loss_mask": e.loss_mask.int().tolist()}) + "\n"
            for e in examples
        )
    )
    return out


def example_order(num_examples: int, seed: int, start: int, count: int) -> list[int]:
    """Example indices for micro-steps ``start .. start+count-1``: a fresh permutation per epoch."""
    order: list[int] = []
    perms: dict[int, list[int]] = {}  # one permutation per epoch touched
    for step in range(start, start + count):
        epoch, pos = divmod(step, num_examples)
        if epoch not in perms:
            g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            perms[epoch] = torch.randperm(num_examples, generator=g).tolist()
        order.append(perms[epoch][pos])
    return order


def extract_features(target, example: Example, aux_ids: tuple[int, ...], index: int) -> FeatureBatch:
    """One target forward over the whole example, capturing aux layers and the final state."""
    last_id = target.num_layers
    ids = tuple(aux_ids) + ((last_id,) if last_id not in aux_ids else ())
    target.reset()
    step = target.forward(example.input_ids, capture=ids)
    h = target.hidden_size
    feats = step.aux_hidden.float()
    last = feats[:, ids.index(last_id) * h : (ids.index(last_id) + 1) * h]
    aux = feats[:, : len(aux_ids) * h]
    target.cache = None
    return FeatureBatch(
        index=index,
        input_ids=example.input_ids,
        loss_mask=example.loss_mask,
        document_ids=torch.zeros_like(example.input_ids),
        aux_hidden=aux.clone(),
        last_hidden=last.clone(),
    )


def _to_wire(batch: FeatureBatch) -> dict:
    """Plain numpy payload: pickled by value, so it outlives the worker process."""
    return {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in batch.__dict__.items()}


def _from_wire(payload: dict) -> FeatureBatch:
    def tensor(v):
        # Ray hands out read-only views of its object store: copy those (torch warns on them).
        return torch.from_numpy(v) if v.flags.writeable else torch.tensor(v)

    return FeatureBatch(**{k: (v if isinstance(v, int) else tensor(v)) for k, v in payload.items()})


class InProcessSource:
    """Target features computed in the trainer's own process."""

    def __init__(self, target, examples: list[Example], aux_ids: tuple[int, ...], seed: int) -> None:
        self.target, self.examples, self.aux_ids, self.seed = target, examples, tuple(aux_ids), seed
        self.wait_seconds = 0.0

    def batches(self, start: int, count: int) -> Iterator[FeatureBatch]:
        for i, idx in enumerate(example_order(len(self.examples), self.seed, start, count)):
            t0 = time.perf_counter()
            batch = extract_features(self.target, self.examples[idx], self.aux_ids, start + i)
            self.wait_seconds += time.perf_counter() - t0
            yield batch

    def close(self) -> None:
        pass


POLL = 0.5  # seconds between liveness checks while waiting on a queue


def _worker(
    target_dir: str,
    data_path: str,
    max_len: int,
    aux_ids,
    seed: int,
    limit,
    dtype: str,
    threads: int,
    start: int,
    count: int,
    part: int,
    parts: int,
    q,
    stop,
):
    """Compute the features of positions ``start + part``, ``start + part + parts``, ... of
    the example order and put them on ``q``; then None. Stops when told, or when the
    process that started it is gone (killed without its clean-up)."""
    from dspark.target import TargetModel

    torch.set_num_threads(threads)
    parent = mp.parent_process()

    def orphaned() -> bool:
        return parent is not None and not parent.is_alive()

    try:
        target = TargetModel.from_pretrained(target_dir, dtype=getattr(torch, dtype))
        examples = load_examples(data_path, max_len=max_len)
        if limit is not None:
            if limit > len(examples):
                raise DSparkError(f"train.max_examples {limit} > the {len(examples)} examples in {data_path}")
            examples = examples[:limit]
        order = example_order(len(examples), seed, start, count)
        for i in range(part, len(order), parts):
            if stop.is_set() or orphaned():
                return
            batch = extract_features(target, examples[order[i]], aux_ids, start + i)
            while True:
                if stop.is_set() or orphaned():
                    return
                try:
                    q.put(_to_wire(batch), timeout=POLL)
                    break
                except queue.Full:
                    continue
        q.put(None)
    except Exception as exc:  # noqa: BLE001 - forwarded to the trainer, which raises it
        q.put(("error", f"{type(exc).__name__}: {exc}"))


class OnlineSource:
    """Target workers in their own processes stream features into bounded queues.

    With ``workers`` N > 1, worker k computes every N-th example from position k and the
    source reads the queues in turn, so the order (and every feature) is the one a single
    worker gives; a worker runs ``threads`` torch threads. Several one-thread workers use
    cores that a trainer waiting on its features leaves idle, without the stalls of one
    many-thread worker whose threads share those cores with the trainer."""

    def __init__(
        self,
        target_dir: str | Path,
        data_path: str | Path,
        aux_ids,
        *,
        seed: int,
        max_len: int,
        queue_size: int = 4,
        limit: int | None = None,
        dtype: str = "float32",
        threads: int = 1,
        workers: int = 1,
    ) -> None:
        """``dtype``: what the target computes in (bfloat16: ~1.7x faster on CPUs with AVX512-BF16);
        ``threads``: each worker's torch threads; ``workers``: target processes."""
        if workers < 1:
            raise DSparkError(f"OnlineSource: workers must be >= 1, got {workers}")
        self.args = (str(target_dir), str(data_path), max_len, tuple(aux_ids), seed, limit, dtype, threads)
        self.workers = workers
        self.queue_size = queue_size
        self.wait_seconds = 0.0  # waiting for batches after the first one arrived
        self.startup_seconds = 0.0  # worker start, target load and the first batch
        self._procs: list = []
        self._stop = None

    def _get(self, k: int, q):
        """The next item of worker ``k``, or a clear error if the worker died without one."""
        while True:
            try:
                return q.get(timeout=POLL)
            except queue.Empty:
                proc = self._procs[k]
                if not proc.is_alive():
                    try:  # its last word may have arrived just now
                        return q.get(timeout=POLL)
                    except queue.Empty:
                        raise DSparkError(
                            f"target worker {k} exited (code {proc.exitcode}) before sending its features"
                        ) from None

    def batches(self, start: int, count: int) -> Iterator[FeatureBatch]:
        ctx = mp.get_context("spawn")
        parts = max(1, min(self.workers, count))
        queues = [ctx.Queue(maxsize=self.queue_size) for _ in range(parts)]
        self._stop = ctx.Event()
        self._procs = [
            ctx.Process(target=_worker, args=(*self.args, start, count, k, parts, queues[k], self._stop), daemon=True)
            for k in range(parts)
        ]
        for proc in self._procs:
            proc.start()
        first = True
        try:
            for i in range(count + 1):  # position count: the None of the worker whose turn it is
                t0 = time.perf_counter()
                item = self._get(i % parts, queues[i % parts])
                if first:
                    self.startup_seconds += time.perf_counter() - t0
                    first = False
                else:
                    self.wait_seconds += time.perf_counter() - t0
                if item is None:
                    return
                if isinstance(item, tuple):
                    raise DSparkError(f"target worker failed: {item[1]}")
                yield _from_wire(item)
        finally:
            self.close()

    def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
        self._procs = []


def assistant_token_counts(examples: list[Example], vocab_size: int) -> torch.Tensor:
    """How often each target id occurs among loss-masked (assistant) tokens."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ex in examples:
        ids = ex.input_ids[ex.loss_mask]
        if ids.numel() and int(ids.max()) >= vocab_size:
            raise DSparkError(f"token id {int(ids.max())} in the data exceeds the target vocab ({vocab_size})")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts
