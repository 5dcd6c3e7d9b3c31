"""Offline hidden-state cache: target features of a dataset in safetensors shards.

``manifest.json`` records the target, the aux layer ids, the example count and each
shard's checksum; writing resumes at the first missing shard, and reading verifies a
shard's checksum before use, so a damaged cache is reported, never trained on.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dspark.errors import CheckpointError, DSparkError
from dspark.io import sha256_file
from dspark.training.data import Example, FeatureBatch, example_order, extract_features

MANIFEST = "manifest.json"


def build_feature_cache(
    target,
    examples: list[Example],
    aux_ids,
    out_dir: str | Path,
    *,
    shard_size: int = 64,
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
) -> Path:
    from tqdm import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    header = {
        "target": str(target.name),
        "aux_layer_ids": list(aux_ids),
        "num_examples": len(examples),
        "shard_size": shard_size,
        "dtype": str(dtype).removeprefix("torch."),
    }
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {**header, "shards": {}}
    if {k: manifest.get(k) for k in header} != header:
        raise DSparkError(f"{out}: holds a cache of different data or settings ({manifest_path}); use a new directory")
    num_shards = -(-len(examples) // shard_size)
    bar = tqdm(total=num_shards, initial=len(manifest["shards"]), desc="cache", unit="shard", disable=not progress)
    for s in range(num_shards):
        name = f"shard_{s:05d}.safetensors"
        if name in manifest["shards"]:
            continue
        tensors = {}
        for i in range(s * shard_size, min(len(examples), (s + 1) * shard_size)):
            f = extract_features(target, examples[i], tuple(aux_ids), i)
            tensors[f"{i}.input_ids"] = f.input_ids.contiguous()
            tensors[f"{i}.loss_mask"] = f.loss_mask.contiguous()
            tensors[f"{i}.aux_hidden"] = f.aux_hidden.to(dtype).contiguous()
            tensors[f"{i}.last_hidden"] = f.last_hidden.to(dtype).contiguous()
        tmp = out / f".{name}.tmp"
        save_file(tensors, str(tmp))
        os.replace(tmp, out / name)
        manifest["shards"][name] = sha256_file(out / name)
        tmp_manifest = out / f".{MANIFEST}.tmp"
        tmp_manifest.write_text(json.dumps(manifest, indent=2))
        os.replace(tmp_manifest, manifest_path)
        bar.update(1)
    bar.close()
    return out


class OfflineSource:
    """Reads a feature cache in the same example order as the online sources."""

    def __init__(self, cache_dir: str | Path, aux_ids, *, seed: int) -> None:
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
        expected = -(-self.manifest["num_examples"] // self.manifest["shard_size"])
        if len(self.manifest["shards"]) != expected:
            raise DSparkError(f"{self.dir}: cache is incomplete ({len(self.manifest['shards'])}/{expected} shards)")
        self.seed = seed
        self.wait_seconds = 0.0
        self._loaded: dict[str, dict] = {}

    def _shard(self, index: int) -> dict:
        name = f"shard_{index // self.manifest['shard_size']:05d}.safetensors"
        if name not in self._loaded:
            path = self.dir / name
            if not path.is_file() or sha256_file(path) != self.manifest["shards"][name]:
                raise CheckpointError(f"{path}: missing or checksum mismatch; rebuild this shard")
            self._loaded = {name: load_file(str(path))}  # keep one shard in memory
        return self._loaded[name]

    def batches(self, start: int, count: int) -> Iterator[FeatureBatch]:
        for i, idx in enumerate(example_order(self.manifest["num_examples"], self.seed, start, count)):
            t0 = time.perf_counter()
            shard = self._shard(idx)
            ids = shard[f"{idx}.input_ids"]
            batch = FeatureBatch(
                index=start + i,
                input_ids=ids,
                loss_mask=shard[f"{idx}.loss_mask"],
                document_ids=torch.zeros_like(ids),
                aux_hidden=shard[f"{idx}.aux_hidden"].float(),
                last_hidden=shard[f"{idx}.last_hidden"].float(),
            )
            self.wait_seconds += time.perf_counter() - t0
            yield batch

    def close(self) -> None:
        self._loaded = {}
