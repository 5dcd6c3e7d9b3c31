"""The target's frozen tensors a drafter borrows (embedding, lm_head) and its shape facts,
read straight from a Hugging Face directory's safetensors without building the model.

Export and import use this: they need the target's embedding (a drafter checkpoint may
leave it out, as speculators does) and its layer count, not a runnable target.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from dspark.errors import CheckpointError

EMBED_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "model.language_model.embed_tokens.weight")
HEAD_NAMES = ("lm_head.weight",)


@dataclass
class TargetFacts:
    directory: Path
    num_layers: int
    hidden_size: int
    vocab_size: int
    architecture: str | None
    embedding: torch.Tensor  # [V, H]
    lm_head: torch.Tensor  # [V, H]

    @property
    def name(self) -> str:
        return str(self.directory)

    # What a drafter borrows, named as on a loaded `TargetModel`.
    def embedding_weight(self) -> torch.Tensor:
        return self.embedding

    def lm_head_weight(self) -> torch.Tensor:
        return self.lm_head


@dataclass(frozen=True)
class TargetShape:
    """The sizes a drafter must match, read from a target's config.json alone (no weights):
    enough for `check_fits` before anything heavy is loaded."""

    name: str
    hidden_size: int
    vocab_size: int
    num_layers: int


def read_target_shape(path: str | Path) -> TargetShape | None:
    """The target's sizes from ``path/config.json``; None when ``path`` is no local Hugging Face
    directory (a .gguf file, a hub id) or its config lacks a size (the full check runs at load)."""
    config_path = Path(path) / "config.json"
    if not config_path.is_file():
        return None
    try:
        config = json.loads(config_path.read_text())
        config = {**config, **(config.get("text_config") or {})}
        return TargetShape(
            name=str(path),
            hidden_size=int(config["hidden_size"]),
            vocab_size=int(config["vocab_size"]),
            num_layers=int(config["num_hidden_layers"]),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None


def read_target_facts(directory: str | Path) -> TargetFacts:
    src = Path(directory)
    config_path = src / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{src}: not a Hugging Face model directory (no config.json)")
    config = json.loads(config_path.read_text())
    config = {**config, **(config.get("text_config") or {})}
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{src}: no .safetensors weights (save the target with safetensors)")
    found: dict[str, torch.Tensor] = {}
    try:
        for path in files:
            with safe_open(str(path), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                    if name in EMBED_NAMES and "embed" not in found:
                        found["embed"] = fh.get_tensor(name).float()
                    elif name in HEAD_NAMES and "head" not in found:
                        found["head"] = fh.get_tensor(name).float()
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{src}: cannot read the target's weights: {exc}") from None
    if "embed" not in found:
        raise CheckpointError(f"{src}: the target's weights have no token embedding ({EMBED_NAMES[0]})")
    head = found.get("head", found["embed"] if config.get("tie_word_embeddings", False) else None)
    if head is None:
        raise CheckpointError(f"{src}: the target has no lm_head.weight and does not tie it to the embedding")
    return TargetFacts(
        directory=src,
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=int(config["hidden_size"]),
        vocab_size=int(found["embed"].shape[0]),
        architecture=(config.get("architectures") or [None])[0],
        embedding=found["embed"],
        lm_head=head,
    )
