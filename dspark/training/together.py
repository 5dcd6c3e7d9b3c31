"""Several drafters from one pass of the target: `dspark train --config A --config B ...`.

The parent process runs the source the recipes share (the target once per row: online,
in-process, vLLM, Ray, or a feature cache) and hands each row's features to one trainer
process per recipe through a bounded queue, so comparing drafters costs one target pass and
no disk; the slowest trainer sets the pace. The recipes must agree on everything the
features and their order depend on (target, data, source, seed, steps, accumulation,
sequence length, example limit, aux layers); they may differ in the drafter and in the
per-step options (anchors, loss weights, learning rate, checkpoints).

Each trainer checkpoints and resumes on its own. On a restart the source starts at the
earliest trainer's position and a trainer that got further skips the rows it has done, so a
killed run resumes exactly, as each recipe alone would.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from dspark.errors import ConfigError, DSparkError
from dspark.training.data import FeatureBatch, _from_wire, _to_wire
from dspark.training.recipe import Recipe

# What the features and their order depend on: these must be equal across the recipes.
SHARED_TOP = ("target", "target_dtype", "target_threads", "target_workers", "data", "source", "cache", "ray", "vllm")
SHARED_TRAIN = ("seed", "steps", "grad_accum", "seq_len", "max_examples")
POLL = 0.5  # seconds between liveness checks while waiting on a queue


def check_shared(recipes: list[Recipe], names: list[str]) -> None:
    """Raise `ConfigError` unless the recipes can share one feature stream."""
    if len(recipes) < 2:
        raise ConfigError("training together needs two or more recipes")
    ref = recipes[0]
    for recipe, name in zip(recipes[1:], names[1:], strict=True):
        for key in SHARED_TOP:
            if getattr(recipe, key) != getattr(ref, key):
                raise ConfigError(
                    f"{name}: {key} is {getattr(recipe, key)!r}, {names[0]} has {getattr(ref, key)!r}; "
                    "recipes trained together share their features, so they must agree on it"
                )
        for key in SHARED_TRAIN:
            mine, theirs = getattr(recipe.train, key), getattr(ref.train, key)
            if mine != theirs:
                raise ConfigError(
                    f"{name}: train.{key} is {mine!r}, {names[0]} has {theirs!r}; "
                    "recipes trained together read the same rows in the same order, so they must agree on it"
                )
    outs = [os.path.realpath(r.out) for r in recipes]
    for i, out in enumerate(outs):
        if out in outs[:i]:
            raise ConfigError(f"{names[i]} and {names[outs.index(out)]} both write to {out}; give each its own out")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("training several recipes together runs without torchrun (one process per recipe)")


class SharedSource:
    """A trainer process's view of the parent's feature stream (built in the child)."""

    def __init__(self, index: int, aux, rows, report) -> None:
        self.index, self.aux, self.rows, self.report = index, tuple(aux), rows, report
        self.wait_seconds = 0.0

    def batches(self, start: int, count: int) -> Iterator[FeatureBatch]:
        # Tell the parent where this trainer resumes before any row is read (also when it
        # has nothing left to do, so a plain function, not a generator, sends it).
        self.report.put(("ready", self.index, self.aux, start, count))
        return self._read()

    def _read(self) -> Iterator[FeatureBatch]:
        parent = mp.parent_process()
        while True:
            t0 = time.perf_counter()
            while True:
                try:
                    item = self.rows.get(timeout=POLL)
                    break
                except queue.Empty:
                    if parent is not None and not parent.is_alive():
                        raise DSparkError("the process running the shared feature source is gone") from None
            self.wait_seconds += time.perf_counter() - t0
            if item is None:
                return
            yield _from_wire(item)  # the parent sends only rows start..end-1

    def close(self) -> None:
        pass


def _trainer(index: int, recipe: Recipe, rows, report, threads: int, status_lines: bool) -> None:
    from dspark.training.run import run_training

    torch.set_num_threads(threads)
    try:
        last = run_training(
            recipe,
            progress=False,
            status_lines=status_lines,
            source_factory=lambda aux: SharedSource(index, aux, rows, report),
        )
        report.put(("done", index, last))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        report.put(("error", index, f"{type(exc).__name__}: {exc}"))


class _Trainers:
    """The trainer processes, their row queues and the one report queue they answer on."""

    def __init__(
        self, recipes: list[Recipe], names: list[str], threads: int, queue_size: int, status_lines: bool = False
    ) -> None:
        ctx = mp.get_context("spawn")
        self.names = names
        self.report = ctx.Queue()
        self.rows = [ctx.Queue(maxsize=queue_size) for _ in recipes]
        self.procs = [
            ctx.Process(target=_trainer, args=(i, r, self.rows[i], self.report, threads, status_lines), daemon=True)
            for i, r in enumerate(recipes)
        ]
        for p in self.procs:
            p.start()
        self.done: dict[int, dict] = {}

    def _check(self, item) -> None:
        kind, i = item[0], item[1]
        if kind == "error":
            raise DSparkError(f"{self.names[i]}: {item[2]}")
        if kind == "done":
            self.done[i] = item[2]

    def _dead(self) -> None:
        for i, p in enumerate(self.procs):
            if not p.is_alive() and i not in self.done:
                # Its last word may still be in the queue.
                with contextlib.suppress(queue.Empty):
                    while True:
                        self._check(self.report.get(timeout=POLL))
                if i not in self.done:
                    raise DSparkError(f"{self.names[i]}: trainer process died (exit code {p.exitcode})")

    def wait(self, kinds: tuple[str, ...]):
        """The next report of one of ``kinds``; errors and dead trainers raise."""
        while True:
            try:
                item = self.report.get(timeout=POLL)
            except queue.Empty:
                self._dead()
                continue
            self._check(item)
            if item[0] in kinds:
                return item

    def put(self, i: int, payload) -> None:
        while i not in self.done:  # a trainer that has finished takes no more rows
            try:
                self.rows[i].put(payload, timeout=POLL)
                return
            except queue.Full:
                self._dead()
                with contextlib.suppress(queue.Empty):  # a trainer that failed says so here
                    self._check(self.report.get_nowait())

    def close(self) -> None:
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()


def _latest_taus(recipes: list[Recipe]) -> str:
    """Each trainer's last logged simulated accept_len, from its train_log.jsonl (for the bar)."""
    parts = []
    for r in recipes:
        log = Path(r.out) / "train_log.jsonl"
        tau = "-"
        if log.is_file():
            with log.open("rb") as fh:
                fh.seek(max(0, log.stat().st_size - 4096))
                for line in reversed(fh.read().splitlines()):
                    try:
                        tau = f"{json.loads(line)['sim_accept_len']:.2f}"
                        break
                    except (ValueError, KeyError):
                        continue
        parts.append(f"{Path(r.out).name} tau {tau}")
    return ", ".join(parts)


def train_together(
    recipes: list[Recipe],
    names: list[str] | None = None,
    *,
    progress: bool = True,
    threads: int = 1,
    queue_size: int = 4,
) -> list[dict]:
    """Train ``recipes`` side by side on one feature stream; returns each one's last metrics.
    ``threads``: torch threads per trainer process. ``names`` label errors (default: out dirs)."""
    from tqdm import tqdm

    from dspark.training.run import build_source, needs_target_here

    names = names or [str(r.out) for r in recipes]
    check_shared(recipes, names)
    # Without the parent's bar, each trainer writes a status line at its checkpoints.
    trainers = _Trainers(recipes, names, threads, queue_size, status_lines=not progress)
    source = None
    try:
        ready = {}
        while len(ready) < len(recipes):
            _, i, aux, start, count = trainers.wait(("ready",))
            ready[i] = (aux, start, start + count)
        aux = ready[0][0]
        for i, (theirs, _, _) in ready.items():
            if theirs != aux:
                raise ConfigError(
                    f"{names[i]} reads aux layers {list(theirs)}, {names[0]} reads {list(aux)}; "
                    "recipes trained together share their features, so they must read the same layers"
                )
        begin = min(start for _, start, _ in ready.values())
        end = max(stop for _, _, stop in ready.values())
        if end > begin:
            recipe = recipes[0]
            target = None
            if needs_target_here(recipe):
                from dspark.devices import device_name
                from dspark.target import TargetModel

                device = device_name(recipe.device) if recipe.source == "inprocess" else "cpu"
                target = TargetModel.from_pretrained(recipe.target, device=device)
            source = build_source(recipe, aux, target)
            bar = tqdm(total=end, initial=begin, desc="rows", unit="row", disable=not progress)
            for batch in source.batches(begin, end - begin):
                payload = _to_wire(batch)
                for i, (_, start, stop) in ready.items():
                    if start <= batch.index < stop:
                        trainers.put(i, payload)
                bar.update(1)
                if progress and batch.index % 50 == 0:
                    bar.set_postfix_str(_latest_taus(recipes))
            bar.close()
        while len(trainers.done) < len(recipes):
            trainers.wait(("done",))
    finally:
        if source is not None:
            source.close()
        trainers.close()
    return [trainers.done[i] for i in range(len(recipes))]
