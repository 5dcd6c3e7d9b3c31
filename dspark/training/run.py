"""Entry points behind `dspark train`: single process, or DDP under torchrun (gloo on CPU)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from dspark.devices import device_name
from dspark.errors import DSparkError
from dspark.training.data import InProcessSource, OnlineSource, load_examples
from dspark.training.recipe import Recipe, build_model
from dspark.training.trainer import Trainer


def _dist_env() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _first(examples: list, limit: int | None, data) -> list:
    if limit is not None and limit > len(examples):
        raise DSparkError(f"train.max_examples {limit} > the {len(examples)} examples in {data}")
    return examples[:limit] if limit else examples


def run_training(recipe: Recipe, *, progress: bool = True, stop_after: int | None = None) -> dict:
    from dspark.target import TargetModel

    rank, world = _dist_env()
    device = torch.device(device_name(recipe.device, rank=rank))
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend)
    # The target runs here only for the in-process and vLLM sources (features, final norm);
    # the others load their own copy where they compute.
    target = TargetModel.from_pretrained(recipe.target, device=device if recipe.source == "inprocess" else "cpu")
    model = build_model(recipe, target).to(device)
    if world > 1:  # every rank starts from rank 0's weights
        for t in model.state_dict().values():
            torch.distributed.broadcast(t, 0)
    aux = model.config.aux_hidden_state_layer_ids
    limit = recipe.train.max_examples
    if recipe.source == "ray":
        from dspark.training.ray_source import RaySource

        del target
        source = RaySource(
            recipe.target,
            recipe.data,
            aux,
            seed=recipe.train.seed,
            max_len=recipe.train.seq_len,
            limit=limit,
            **recipe.ray,
        )
    elif recipe.source == "offline":
        from dspark.training.feature_cache import OfflineSource

        source = OfflineSource(recipe.cache, aux, seed=recipe.train.seed, limit=limit)
    elif recipe.source == "vllm":
        from dspark.training.vllm_source import VllmSource

        examples = _first(load_examples(recipe.data, max_len=recipe.train.seq_len), limit, recipe.data)
        source = VllmSource(
            recipe.vllm["url"],
            target,
            examples,
            aux,
            seed=recipe.train.seed,
            concurrency=int(recipe.vllm.get("concurrency", 4)),
        )
    elif recipe.source == "online":
        del target  # the worker process loads its own copy
        source = OnlineSource(
            recipe.target, recipe.data, aux, seed=recipe.train.seed, max_len=recipe.train.seq_len, limit=limit
        )
    else:
        examples = load_examples(recipe.data, max_len=recipe.train.seq_len)
        source = InProcessSource(target, _first(examples, limit, recipe.data), aux, seed=recipe.train.seed)
    out = Path(recipe.out)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "recipe.json").write_text(
            json.dumps(
                {
                    "target": str(recipe.target),
                    "data": str(recipe.data),
                    "source": recipe.source,
                    "preset": recipe.preset,
                    "drafter": recipe.drafter,
                    "device": str(device),
                    "world_size": world,
                    "train": recipe.train.__dict__,
                },
                indent=2,
                default=str,
            )
        )
    trainer = Trainer(model, source, recipe.train, out, rank=rank, world_size=world, progress=progress)
    try:
        return trainer.train(stop_after=stop_after)
    except StopIteration:
        raise DSparkError("the data source ran out before the last step") from None
    finally:
        if world > 1:
            torch.distributed.barrier()
