"""Offline hidden-state cache: target features of a dataset in safetensors shards.

``manifest.json`` records the target, the dtype the target ran in, the aux layer ids, the
example count and each shard's checksum. Building resumes at the missing shards and may
spread them over worker processes (one torch thread each: on small CPUs two single-thread
processes do ~1.4x what one two-thread process does). Reading verifies each shard's
checksum once, then reads single examples from it memory-mapped, so a damaged cache is
reported, never trained on, and a large cache costs no more per step than a small one.
A source may use the first ``limit`` examples only: a cache of a seeded export serves every
smaller subset of it (``dspark corpus export --seed S --rows N`` gives prefixes of one order).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dspark.errors import CheckpointError, DSparkError
from dspark.io import sha256_file
from dspark.training.data import Example, FeatureBatch, example_order, extract_features

MANIFEST = "manifest.json"


def _shard_name(index: int) -> str:
    return f"shard_{index:05d}.safetensors"


def _write_shard(features, examples: list[Example], out: Path, s: int, shard_size: int, dtype, threads: int = 1) -> str:
    """Compute shard ``s`` with ``features(example, index) -> FeatureBatch`` (``threads`` calls
    at once: a server answers several) and write it atomically; returns its sha256."""
    indices = range(s * shard_size, min(len(examples), (s + 1) * shard_size))
    if threads > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            batches = list(pool.map(lambda i: features(examples[i], i), indices))
    else:
        batches = [features(examples[i], i) for i in indices]
    tensors = {}
    for i, f in zip(indices, batches, strict=True):
        tensors[f"{i}.input_ids"] = f.input_ids.contiguous()
        tensors[f"{i}.loss_mask"] = f.loss_mask.contiguous()
        tensors[f"{i}.aux_hidden"] = f.aux_hidden.to(dtype).contiguous()
        tensors[f"{i}.last_hidden"] = f.last_hidden.to(dtype).contiguous()
    name = _shard_name(s)
    tmp = out / f".{name}.{os.getpid()}.tmp"
    save_file(tensors, str(tmp))
    os.replace(tmp, out / name)
    return sha256_file(out / name)


def _in_process(target, aux_ids):
    return lambda example, index: extract_features(target, example, tuple(aux_ids), index)


_WORKER: dict = {}


def _worker_init(target_dir: str, target_dtype: str, data: str, max_len: int, aux_ids, out: str, shard_size, dtype):
    from dspark.target import TargetModel
    from dspark.training.data import load_examples

    torch.set_num_threads(1)
    target = TargetModel.from_pretrained(target_dir, dtype=getattr(torch, target_dtype))
    target.check_layer_ids(aux_ids)
    _WORKER.update(
        target=target,
        examples=load_examples(data, max_len=max_len),
        aux_ids=aux_ids,
        out=Path(out),
        shard_size=shard_size,
        dtype=dtype,
    )


def _worker_shard(s: int) -> tuple[int, str]:
    w = _WORKER
    features = _in_process(w["target"], w["aux_ids"])
    return s, _write_shard(features, w["examples"], w["out"], s, w["shard_size"], w["dtype"])


def build_feature_cache(
    target,
    examples: list[Example],
    aux_ids,
    out_dir: str | Path,
    *,
    shard_size: int = 64,
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
    workers: int = 1,
    target_dir: str | Path | None = None,
    data: str | Path | None = None,
    max_len: int | None = None,
    vllm=None,
    vllm_concurrency: int = 8,
) -> Path:
    """Write the features of ``examples`` to ``out_dir`` (resumes; refuses another dataset's cache).

    ``workers > 1`` computes shards in that many processes, each loading the target from
    ``target_dir`` (in ``target``'s dtype) and the examples from ``data`` / ``max_len``;
    ``target`` itself then only names the target and its dtype. ``vllm``: a
    `VllmHiddenStates` client computes them instead (``vllm_concurrency`` requests at once);
    the manifest records the source, and a cache is never filled from two sources."""
    from tqdm import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    target_dtype = str(target.dtype).removeprefix("torch.")
    header = {
        "target": str(target.name),
        "target_dtype": target_dtype,
        "aux_layer_ids": list(aux_ids),
        "num_examples": len(examples),
        "shard_size": shard_size,
        "dtype": str(dtype).removeprefix("torch."),
        "source": "in-process" if vllm is None else "vllm",
    }
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {**header, "shards": {}}
    manifest.setdefault("target_dtype", "float32")  # caches written before the field existed
    manifest.setdefault("source", "in-process")
    if {k: manifest.get(k) for k in header} != header:
        theirs = {k: manifest.get(k) for k in header if manifest.get(k) != header[k]}
        raise DSparkError(
            f"{out}: holds a cache of different data or settings ({theirs} in {manifest_path}); use a new directory"
        )
    num_shards = -(-len(examples) // shard_size)
    todo = [s for s in range(num_shards) if _shard_name(s) not in manifest["shards"]]
    bar = tqdm(total=num_shards, initial=num_shards - len(todo), desc="cache", unit="shard", disable=not progress)

    def record(s: int, sha: str) -> None:
        manifest["shards"][_shard_name(s)] = sha
        manifest["shards"] = dict(sorted(manifest["shards"].items()))
        tmp_manifest = out / f".{MANIFEST}.tmp"
        tmp_manifest.write_text(json.dumps(manifest, indent=2))
        os.replace(tmp_manifest, manifest_path)
        bar.update(1)

    features, threads = (_in_process(target, aux_ids), 1) if vllm is None else (vllm.features, vllm_concurrency)
    if workers > 1 and len(todo) > 1 and vllm is None:
        if target_dir is None or data is None:
            raise ValueError("build_feature_cache(workers > 1) needs target_dir and data")
        args = (str(target_dir), target_dtype, str(data), max_len, tuple(aux_ids), str(out), shard_size, dtype)
        with mp.get_context("spawn").Pool(min(workers, len(todo)), initializer=_worker_init, initargs=args) as pool:
            for s, sha in pool.imap_unordered(_worker_shard, todo):
                record(s, sha)
    else:
        for s in todo:
            record(s, _write_shard(features, examples, out, s, shard_size, dtype, threads))
    bar.close()
    return out


class OfflineSource:
    """Reads a feature cache in the same example order as the online sources.

    ``limit``: train on the cache's first ``limit`` examples only."""

    def __init__(self, cache_dir: str | Path, aux_ids, *, seed: int, limit: int | None = None) -> None:
        self.dir = Path(cache_dir)
        path = self.dir / MANIFEST
        if not path.is_file():
            raise DSparkError(f"{self.dir}: no {MANIFEST}; build the cache first")
        self.manifest = json.loads(path.read_text())
        if tuple(self.manifest["aux_layer_ids"]) != tuple(aux_ids):
            raise DSparkError(
                f"{self.dir}: cached aux layers {self.manifest['aux_layer_ids']} differ from the "
                f"drafter's {list(aux_ids)}"
            )
        total = int(self.manifest["num_examples"])
        if limit is not None and not 0 < limit <= total:
            raise DSparkError(f"{self.dir}: asked for the first {limit} examples of a cache of {total}")
        self.num_examples = limit or total
        needed = -(-self.num_examples // self.manifest["shard_size"])  # a prefix needs only its shards
        missing = [s for s in range(needed) if _shard_name(s) not in self.manifest["shards"]]
        if missing:
            expected = -(-total // self.manifest["shard_size"])
            raise DSparkError(
                f"{self.dir}: cache is incomplete ({len(self.manifest['shards'])}/{expected} shards; "
                f"{_shard_name(missing[0])} is missing)"
            )
        self.seed = seed
        self.wait_seconds = 0.0
        self._verified: set[str] = set()
        self._open: dict[str, object] = {}

    def _shard(self, index: int):
        name = _shard_name(index // self.manifest["shard_size"])
        if name not in self._verified:
            path = self.dir / name
            if not path.is_file() or sha256_file(path) != self.manifest["shards"][name]:
                raise CheckpointError(f"{path}: missing or checksum mismatch; rebuild this shard")
            self._verified.add(name)
        if name not in self._open:
            if len(self._open) >= 8:
                self._open.pop(next(iter(self._open)))
            self._open[name] = safe_open(str(self.dir / name), framework="pt")
        return self._open[name]

    def batches(self, start: int, count: int) -> Iterator[FeatureBatch]:
        for i, idx in enumerate(example_order(self.num_examples, self.seed, start, count)):
            t0 = time.perf_counter()
            shard = self._shard(idx)
            ids = shard.get_tensor(f"{idx}.input_ids")
            batch = FeatureBatch(
                index=start + i,
                input_ids=ids,
                loss_mask=shard.get_tensor(f"{idx}.loss_mask"),
                document_ids=torch.zeros_like(ids),
                aux_hidden=shard.get_tensor(f"{idx}.aux_hidden").float(),
                last_hidden=shard.get_tensor(f"{idx}.last_hidden").float(),
            )
            self.wait_seconds += time.perf_counter() - t0
            yield batch

    def close(self) -> None:
        self._open = {}
