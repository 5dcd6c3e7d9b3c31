"""A drafter of any registered family (`dspark.families`) in memory and on disk: built
untrained for a target (`init_drafter`), saved and loaded in the speculators format
(``config.json`` + ``model.safetensors``; `dspark.formats.speculators` has the field and
tensor names), and checked against a target from its config alone (`check_config_fits`).

Writes are atomic (temporary name, then rename). Loading validates everything it reads
and raises `CheckpointError` naming the file and what is wrong. Checkpoints written by
speculators itself load too: frozen copies it leaves out (``embed_tokens``, a full-vocab
``lm_head``, identity ``d2t``/``t2d``) are taken from the target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dspark.errors import CheckpointError, ConfigError, DSparkError, IncompatibleDraftError
from dspark.families import family_of
from dspark.families import get as get_family
from dspark.formats.speculators import CONFIG_NAME, LEGACY_CONFIG_NAME, read_json
from dspark.io import atomic_write, atomic_write_text
from dspark.model.config import DSparkConfig
from dspark.model.pairing import check_fits
from dspark.model.vocab import identity_mapping, validate_vocab_mapping

WEIGHTS_NAME = "model.safetensors"
EMBED = "embed_tokens.weight"


def load_config(directory: str | Path, *, num_target_layers: int | None = None) -> Any:
    """The drafter config of ``directory``: speculators ``config.json`` read by the family its
    ``speculators_model_type`` names, or our older ``dspark_config.json`` (DSpark only).
    ``num_target_layers`` completes a config written by another tool (from the target)."""
    src = Path(directory)
    path = src / CONFIG_NAME
    if path.is_file():
        data = read_json(path)
        kind = data.get("speculators_model_type")
        try:
            family = get_family(kind)
        except DSparkError:
            raise ConfigError(f"{path}: speculators_model_type {kind!r} is not a drafter family dspark knows") from None
        return family.from_speculators(data, source=str(path), num_target_layers=num_target_layers)
    legacy = src / LEGACY_CONFIG_NAME
    if legacy.is_file():
        return DSparkConfig.from_dict(read_json(legacy), source=str(legacy))
    raise ConfigError(f"{src}: no drafter config (expected {CONFIG_NAME}, speculators format)")


def config_json_text(config: Any) -> str:
    """The speculators ``config.json`` of a config, as its family writes it."""
    return json.dumps(family_of(config).to_speculators(config), indent=2) + "\n"


def save_config(config: Any, directory: str | Path) -> Path:
    path = Path(directory) / CONFIG_NAME
    atomic_write_text(path, config_json_text(config))
    return path


def check_config_fits(draft: str | Path, target) -> None:
    """`check_fits` from a drafter directory's config alone: a mismatch names the fields
    before any weights are read, in the one wording whichever side is wrong."""
    try:
        config = load_config(draft, num_target_layers=target.num_layers)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    check_fits(config, target)


def init_drafter(target, config: Any, *, seed: int = 0, vocab: tuple[torch.Tensor, torch.Tensor] | None = None):
    """An untrained drafter of ``config``'s family for ``target``: random trainable weights,
    frozen copies of the target's embedding and lm_head.

    ``vocab`` = (d2t, t2d) for a pruned draft vocab (required when the config prunes)."""
    check_fits(config, target)
    torch.manual_seed(seed)
    model = family_of(config).model_class(config)
    if vocab is not None:
        model.set_vocab_mapping(*vocab)
    elif config.uses_pruned_vocab:
        raise IncompatibleDraftError(
            f"draft_vocab_size {config.draft_vocab_size} < target vocab {config.target_vocab_size} needs "
            "d2t/t2d tables (build them with `dspark vocab`)"
        )
    else:
        model.set_vocab_mapping(*identity_mapping(config.target_vocab_size))
    model.copy_target_weights(
        target.embedding_weight().detach().float().cpu(), target.lm_head_weight().detach().float().cpu()
    )
    return model


def save_drafter(
    model,
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
    full_vocab = not model.config.uses_pruned_vocab
    for name, tensor in model.state_dict().items():
        if name == EMBED and not include_embeddings:
            continue
        if full_vocab and name in ("d2t", "t2d"):
            continue  # speculators has no vocab tables for a full draft vocab
        t = tensor.detach().cpu()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        tensors[name] = t.contiguous()
    metadata = {"format": "pt", "embed_tokens": "included" if include_embeddings else "from_target"}
    atomic_write(out / WEIGHTS_NAME, lambda tmp: save_file(tensors, tmp, metadata=metadata))
    atomic_write_text(out / CONFIG_NAME, config_json_text(model.config))
    legacy = out / LEGACY_CONFIG_NAME
    if legacy.is_file():  # an older-format config beside the new one would be ambiguous
        legacy.unlink()
    return out


def load_drafter(
    directory: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    target_embedding: torch.Tensor | None = None,
    target_lm_head: torch.Tensor | None = None,
    num_target_layers: int | None = None,
):
    """Load a drafter, checking config, tensor names, shapes and the vocab mapping.

    A checkpoint saved without ``embed_tokens`` needs ``target_embedding`` [V, H]; a
    full-vocab one without ``lm_head`` needs ``target_lm_head`` [V, H]."""
    src = Path(directory)
    if not src.is_dir():
        raise CheckpointError(f"{src}: drafter directory not found")
    try:
        config = load_config(src, num_target_layers=num_target_layers)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    state = read_weights(src / WEIGHTS_NAME)
    return build_drafter(
        config,
        state,
        source=str(src / WEIGHTS_NAME),
        device=device,
        dtype=dtype,
        target_embedding=target_embedding,
        target_lm_head=target_lm_head,
    )


def read_weights(weights: Path) -> dict[str, torch.Tensor]:
    if not weights.is_file():
        raise CheckpointError(f"{weights}: weights file missing")
    try:
        return load_file(str(weights))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{weights}: cannot read safetensors file (truncated or corrupt?): {exc}") from None


def _frozen_from_target(
    state: dict[str, torch.Tensor], name: str, tensor: torch.Tensor | None, shape: tuple[int, int], source: str
) -> None:
    if tensor is None:
        raise CheckpointError(f"{source}: stores no {name} (a frozen copy of the target's); pass the target")
    if tuple(tensor.shape) != shape:
        raise CheckpointError(
            f"{source}: the target's {name} has shape {tuple(tensor.shape)}, the drafter expects {shape}"
        )
    state[name] = tensor.detach().to("cpu", torch.float32)


def build_drafter(
    config: Any,
    state: dict[str, torch.Tensor],
    *,
    source: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    target_embedding: torch.Tensor | None = None,
    target_lm_head: torch.Tensor | None = None,
):
    """Validate a state dict (our / speculators names) against ``config`` and build the model."""
    state = dict(state)
    for name in ("verifier_lm_head.weight", "verifier_norm.weight", "rotary_emb.inv_freq"):
        state.pop(name, None)  # speculators rebuilds these from the verifier
    vocab_shape = (config.target_vocab_size, config.hidden_size)
    if EMBED not in state:
        _frozen_from_target(state, EMBED, target_embedding, vocab_shape, source)
    if not config.uses_pruned_vocab:
        if "d2t" not in state and "t2d" not in state:
            state["d2t"], state["t2d"] = identity_mapping(config.target_vocab_size)
        if "lm_head.weight" not in state:
            _frozen_from_target(state, "lm_head.weight", target_lm_head, vocab_shape, source)
    model_class = family_of(config).model_class
    with torch.device("meta"):
        reference = model_class(config)
    expected = dict(reference.state_dict())
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: tensor names do not match the config"
            + (f"; missing {missing[:6]}{'...' if len(missing) > 6 else ''}" if missing else "")
            + (f"; unexpected {unexpected[:6]}{'...' if len(unexpected) > 6 else ''}" if unexpected else "")
        )
    for name, ref in expected.items():
        if tuple(state[name].shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{source}: tensor {name} has shape {tuple(state[name].shape)}, the config implies {tuple(ref.shape)}"
            )
    validate_vocab_mapping(state["d2t"], state["t2d"], config.draft_vocab_size, config.target_vocab_size, source=source)
    for name, t in state.items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise CheckpointError(f"{source}: tensor {name} contains NaN or Inf")
    model = model_class(config)
    model.load_state_dict(state, strict=True)
    if dtype is not None:
        model.to(dtype=dtype)
    return model.to(device).eval()
