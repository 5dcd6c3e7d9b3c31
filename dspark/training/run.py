"""Entry points behind `dspark train`: single process, or DDP under torchrun (gloo on CPU)."""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

import torch

from dspark.devices import device_name
from dspark.errors import DSparkError
from dspark.training.data import InProcessSource, OnlineSource, load_examples
from dspark.training.recipe import Recipe, build_model
from dspark.training.trainer import TrainConfig, Trainer


def _dist_env() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _first(examples: list, limit: int | None, data) -> list:
    if limit is not None and limit > len(examples):
        raise DSparkError(f"train.max_examples {limit} > the {len(examples)} examples in {data}")
    return examples[:limit] if limit else examples


def needs_target_here(recipe: Recipe) -> bool:
    """Whether the recipe's source computes features with a target in this process."""
    return recipe.source in ("inprocess", "vllm")


def build_source(recipe: Recipe, aux, target=None):
    """The feature source a recipe names, for drafters reading aux layers ``aux``.
    ``target``: the loaded target, for the sources that run one here (`needs_target_here`)."""
    limit = recipe.train.max_examples
    # What the sources that load their own target and rows take alike.
    streaming = dict(seed=recipe.train.seed, max_len=recipe.train.seq_len, limit=limit, dtype=recipe.target_dtype)
    if recipe.source == "ray":
        from dspark.training.ray_source import RaySource

        return RaySource(recipe.target, recipe.data, aux, **streaming, **recipe.ray)
    if recipe.source == "offline":
        from dspark.training.feature_cache import OfflineSource

        return OfflineSource(recipe.cache, aux, seed=recipe.train.seed, limit=limit)
    if recipe.source == "online":  # the worker process loads its own copy of the target
        return OnlineSource(
            recipe.target, recipe.data, aux, threads=recipe.target_threads, workers=recipe.target_workers, **streaming
        )
    examples = _first(load_examples(recipe.data, max_len=recipe.train.seq_len), limit, recipe.data)
    if recipe.source == "vllm":
        from dspark.training.vllm_source import VllmSource

        return VllmSource(
            recipe.vllm["url"],
            target,
            examples,
            aux,
            seed=recipe.train.seed,
            concurrency=int(recipe.vllm.get("concurrency", 4)),
        )
    if recipe.target_dtype != "float32":  # the drafter's weights came from the fp32 copy; features from this one
        from dspark.target import TargetModel

        target = TargetModel.from_pretrained(
            recipe.target, device=target.device, dtype=getattr(torch, recipe.target_dtype)
        )
    return InProcessSource(target, examples, aux, seed=recipe.train.seed)


def run_training(
    recipe: Recipe,
    *,
    progress: bool = True,
    stop_after: int | None = None,
    source_factory=None,
    status_lines: bool | None = None,
) -> dict:
    """Train one recipe. ``source_factory(aux_ids) -> source`` replaces the recipe's own source
    (`dspark.training.together` hands several trainers the features of one source)."""
    from dspark.target import TargetModel

    rank, world = _dist_env()
    device = torch.device(device_name(recipe.device, rank=rank))
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend)
    # The target runs here only for the in-process and vLLM sources (features, final norm);
    # the others load their own copy where they compute.
    own_source = source_factory is None
    on_device = own_source and recipe.source == "inprocess"
    target = TargetModel.from_pretrained(recipe.target, device=device if on_device else "cpu")
    model = build_model(recipe, target).to(device)
    if world > 1:  # every rank starts from rank 0's weights
        for t in model.state_dict().values():
            torch.distributed.broadcast(t, 0)
    aux = model.config.aux_hidden_state_layer_ids
    if own_source:
        source = build_source(recipe, aux, target if needs_target_here(recipe) else None)
    else:
        source = source_factory(aux)
    del target  # the source keeps it where it computes with it
    out = Path(recipe.out)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "recipe.json").write_text(
            json.dumps(
                {
                    "target": str(recipe.target),
                    "data": str(recipe.data),
                    "source": recipe.source,
                    "cache": str(recipe.cache) if recipe.cache else None,
                    "target_dtype": recipe.target_dtype,
                    "target_threads": recipe.target_threads,
                    "target_workers": recipe.target_workers,
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
    trainer = Trainer(
        model, source, recipe.train, out, rank=rank, world_size=world, progress=progress, status_lines=status_lines
    )
    try:
        return trainer.train(stop_after=stop_after)
    except StopIteration:
        raise DSparkError("the data source ran out before the last step") from None
    finally:
        if world > 1:
            torch.distributed.barrier()


def snapshot_drafter(run_dir: str | Path, out: str | Path, *, step: int | None = None) -> tuple[Path, int]:
    """Write the drafter of a run's stage checkpoint (the latest, or ``step``) as a drafter
    directory, as the run would write its ``final`` one: to evaluate, bench or serve a run
    before it ends. Returns (the directory, its step). Refuses an existing ``out``."""
    from dspark.formats.checkpoint import save_drafter
    from dspark.target import TargetModel
    from dspark.training.trainer import read_checkpoint

    run_dir, out = Path(run_dir), Path(out)
    described = run_dir / "recipe.json"
    if not described.is_file():
        raise DSparkError(f"{run_dir}: not a training run (no recipe.json; `dspark train` writes it in its out)")
    found = sorted((run_dir / "checkpoints").glob("step_*")) if (run_dir / "checkpoints").is_dir() else []
    if not found:
        raise DSparkError(f"{run_dir}: no stage checkpoint yet (checkpoints/step_*)")
    if step is None:
        chosen = found[-1]
    else:
        chosen = run_dir / "checkpoints" / f"step_{step:07d}"
        if chosen not in found:
            have = ", ".join(str(int(p.name.removeprefix("step_"))) for p in found)
            raise DSparkError(f"{run_dir}: no checkpoint of step {step} (kept: {have})")
    if out.exists():
        raise DSparkError(f"{out} exists; give a new directory")
    raw = json.loads(described.read_text())
    train = TrainConfig(**{k: v for k, v in raw["train"].items() if k in {f.name for f in fields(TrainConfig)}})
    recipe = Recipe(
        target=Path(raw["target"]),
        data=Path(raw["data"]),
        out=run_dir,
        preset=raw.get("preset"),
        drafter=dict(raw.get("drafter") or {}),
        train=train,
    )
    try:
        state = read_checkpoint(chosen)
    except FileNotFoundError:  # the running trainer rotated it out while we read it
        raise DSparkError(f"{chosen} was removed while being read (the run keeps the latest few); run again") from None
    target = TargetModel.from_pretrained(recipe.target)
    model = build_model(recipe, target)
    model.load_state_dict(state["model"])
    model.eval()
    save_drafter(model, out, include_embeddings=train.save_embeddings, dtype=getattr(torch, train.save_dtype))
    return out, int(state["step"])
