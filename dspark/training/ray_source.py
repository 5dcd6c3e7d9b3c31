"""Hidden-state source on Ray: target workers as actors, anywhere in a Ray cluster.

Each actor loads the target and the examples once and returns the features of one
micro-step on request; the trainer keeps a bounded number of requests in flight
(round-robin over the actors) and consumes the answers in order, so the example order,
and the loss curve, match the other sources. Needs ``pip install 'dspark[ray]'``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import torch

from dspark.errors import DSparkError
from dspark.training.data import _from_wire, _to_wire, example_order, extract_features, load_examples


class _TargetWorker:
    def __init__(
        self, target_dir: str, data_path: str, max_len: int, aux_ids, num_threads: int, dtype: str = "float32"
    ) -> None:
        from dspark.target import TargetModel

        torch.set_num_threads(num_threads)
        self.target = TargetModel.from_pretrained(target_dir, dtype=getattr(torch, dtype))
        self.examples = load_examples(data_path, max_len=max_len)
        self.aux_ids = tuple(aux_ids)

    def num_examples(self) -> int:
        return len(self.examples)

    def features(self, example_index: int, step_index: int) -> dict:
        return _to_wire(extract_features(self.target, self.examples[example_index], self.aux_ids, step_index))


class RaySource:
    def __init__(
        self,
        target_dir: str | Path,
        data_path: str | Path,
        aux_ids,
        *,
        seed: int,
        max_len: int,
        num_workers: int = 1,
        in_flight: int = 4,
        num_cpus_per_worker: float = 1.0,
        address: str | None = None,
        limit: int | None = None,
        dtype: str = "float32",
    ) -> None:
        try:
            import ray
        except ImportError:
            raise DSparkError("source: ray needs Ray: pip install 'dspark[ray]'") from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        actor = ray.remote(num_cpus=num_cpus_per_worker)(_TargetWorker)
        self.workers = [
            actor.remote(
                str(target_dir), str(data_path), max_len, tuple(aux_ids), max(1, int(num_cpus_per_worker)), dtype
            )
            for _ in range(num_workers)
        ]
        self.num_examples = ray.get(self.workers[0].num_examples.remote())
        if limit is not None:
            if limit > self.num_examples:
                raise DSparkError(f"train.max_examples {limit} > the {self.num_examples} examples in {data_path}")
            self.num_examples = limit
        self.seed, self.in_flight = seed, in_flight
        self.wait_seconds = 0.0

    def batches(self, start: int, count: int) -> Iterator:
        order = example_order(self.num_examples, self.seed, start, count)
        pending: deque = deque()
        nxt = 0
        while nxt < count or pending:
            while nxt < count and len(pending) < self.in_flight:
                worker = self.workers[nxt % len(self.workers)]
                pending.append(worker.features.remote(order[nxt], start + nxt))
                nxt += 1
            t0 = time.perf_counter()
            try:
                item = self.ray.get(pending.popleft())
            except self.ray.exceptions.RayError as exc:
                raise DSparkError(f"Ray target worker failed: {exc}") from None
            self.wait_seconds += time.perf_counter() - t0
            yield _from_wire(item)

    def close(self) -> None:
        for w in self.workers:
            self.ray.kill(w)
        self.workers = []
