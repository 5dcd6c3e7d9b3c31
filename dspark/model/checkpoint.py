"""Saving and loading drafter checkpoints: ``dspark_config.json`` + ``model.safetensors``.

Writes are atomic (temporary name, then rename). Loading validates everything it reads
and raises `CheckpointError` naming the file and what is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from dspark.errors import CheckpointError, ConfigError
from dspark.io import atomic_write, atomic_write_text
from dspark.model.config import DSparkConfig
from dspark.model.dspark import DSparkDraftModel
from dspark.model.vocab import validate_vocab_mapping

WEIGHTS_NAME = "model.safetensors"


EMBED = "embed_tokens.weight"


def save_drafter(
    model: DSparkDraftModel,
    directory: str | Path,
    *,
    dtype: torch.dtype | None = None,
    include_embeddings: bool = True,
) -> Path:
    """Write config and weights into ``directory`` (created if needed). Floats cast to ``dtype``.

    ``include_embeddings=False`` leaves out ``embed_tokens`` (a frozen copy of the target's
    embedding, often the largest tensor); loading then takes it from the target."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name == EMBED and not include_embeddings:
            continue
        t = tensor.detach().cpu()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        tensors[name] = t.contiguous()
    metadata = {"format": "pt", "embed_tokens": "included" if include_embeddings else "from_target"}
    atomic_write(out / WEIGHTS_NAME, lambda tmp: save_file(tensors, tmp, metadata=metadata))
    config_text = json.dumps(model.config.to_dict(), indent=2, sort_keys=True) + "\n"
    atomic_write_text(out / DSparkConfig.FILE_NAME, config_text)
    return out


def load_drafter(
    directory: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    target_embedding: torch.Tensor | None = None,
) -> DSparkDraftModel:
    """Load a drafter, checking config, tensor names, shapes and the vocab mapping.

    A checkpoint saved without ``embed_tokens`` needs ``target_embedding`` [V, H]."""
    src = Path(directory)
    if not src.is_dir():
        raise CheckpointError(f"{src}: drafter directory not found")
    try:
        config = DSparkConfig.load(src)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    weights = src / WEIGHTS_NAME
    if not weights.is_file():
        raise CheckpointError(f"{weights}: weights file missing")
    try:
        state = load_file(str(weights))
        with safe_open(str(weights), framework="pt") as fh:
            embed_mode = (fh.metadata() or {}).get("embed_tokens", "included")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{weights}: cannot read safetensors file (truncated or corrupt?): {exc}") from None
    if EMBED not in state and embed_mode == "from_target":
        if target_embedding is None:
            raise CheckpointError(f"{weights}: stores no embed_tokens (taken from the target); pass the target")
        expected_shape = (config.target_vocab_size, config.hidden_size)
        if tuple(target_embedding.shape) != expected_shape:
            raise CheckpointError(
                f"{weights}: the target's embedding has shape {tuple(target_embedding.shape)}, the drafter "
                f"expects {expected_shape}"
            )
        state[EMBED] = target_embedding.detach().to("cpu", torch.float32)
    with torch.device("meta"):
        reference = DSparkDraftModel(config)
    expected = dict(reference.state_dict())
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{weights}: tensor names do not match the config"
            + (f"; missing {missing[:6]}{'...' if len(missing) > 6 else ''}" if missing else "")
            + (f"; unexpected {unexpected[:6]}{'...' if len(unexpected) > 6 else ''}" if unexpected else "")
        )
    for name, ref in expected.items():
        if tuple(state[name].shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{weights}: tensor {name} has shape {tuple(state[name].shape)}, the config implies {tuple(ref.shape)}"
            )
    validate_vocab_mapping(
        state["d2t"], state["t2d"], config.draft_vocab_size, config.target_vocab_size, source=str(weights)
    )
    for name, t in state.items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise CheckpointError(f"{weights}: tensor {name} contains NaN or Inf")
    model = DSparkDraftModel(config)
    model.load_state_dict(state, strict=True)
    if dtype is not None:
        model.to(dtype=dtype)
    return model.to(device).eval()
