"""`DSparkConfig`: every architectural field of a DSpark drafter, validated on construction.

The config is saved beside the weights as a speculators ``config.json``
(`dspark.formats.checkpoint.save_config`, fields in `dspark.formats.speculators`) and is the
only thing loading reads to rebuild the model: nothing is guessed from a path or a tensor shape.

Layer-id convention (``aux_hidden_state_layer_ids``): the speculators one. Id ``i``
selects Hugging Face ``hidden_states[i]``, i.e. the *input* of decoder layer ``i``
(the output of decoder layer ``i - 1``); ``0`` is the embedding output and
``num_target_layers`` is the final, normed hidden state. DeepSpec / z-lab
``target_layer_ids`` are these values minus one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dspark.errors import ConfigError

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
LAYER_ID_CONVENTION = "hf_hidden_states_index"


@dataclass(frozen=True)
class DSparkConfig:
    """Architecture of a DSpark drafter (DFlash backbone + Markov head + confidence head).

    ``markov_rank=0`` and ``enable_confidence_head=False`` give a plain DFlash drafter.
    """

    # Backbone (Qwen3-style decoder layers).
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    # Vocabularies: the draft vocab is a pruned subset of the target vocab (d2t/t2d).
    draft_vocab_size: int
    target_vocab_size: int
    # Target features.
    target_hidden_size: int
    aux_hidden_state_layer_ids: tuple[int, ...]
    num_target_layers: int
    # Block drafting.
    block_size: int = 8
    mask_token_id: int = 0
    sample_from_anchor: bool = True
    # DSpark heads.
    markov_rank: int = 256
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    # Numerics.
    rope_theta: float = 50000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    # Whether the target's final norm is applied to its last hidden state before the
    # lm_head when computing training targets (False: the captured state is already normed).
    apply_verifier_norm: bool = False
    aux_layer_id_convention: str = LAYER_ID_CONVENTION
    # Free-form provenance (the target it was made for, ...). Not architectural.
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    FILE_NAME: ClassVar[str] = "config.json"

    def __post_init__(self) -> None:
        object.__setattr__(self, "aux_hidden_state_layer_ids", tuple(int(i) for i in self.aux_hidden_state_layer_ids))
        self._validate()

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        positive = (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "draft_vocab_size",
            "target_vocab_size",
            "target_hidden_size",
            "num_target_layers",
            "block_size",
            "max_position_embeddings",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"DSparkConfig.{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"DSparkConfig.num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"DSparkConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if self.hidden_size != self.target_hidden_size:
            raise ConfigError(
                f"DSparkConfig.hidden_size ({self.hidden_size}) must equal target_hidden_size "
                f"({self.target_hidden_size}): the drafter reuses the target's frozen "
                "embedding and lm_head"
            )
        if self.draft_vocab_size > self.target_vocab_size:
            raise ConfigError(
                f"DSparkConfig.draft_vocab_size ({self.draft_vocab_size}) exceeds "
                f"target_vocab_size ({self.target_vocab_size})"
            )
        if not 0 <= self.mask_token_id < self.target_vocab_size:
            raise ConfigError(
                f"DSparkConfig.mask_token_id ({self.mask_token_id}) is outside the target "
                f"vocab [0, {self.target_vocab_size})"
            )
        ids = self.aux_hidden_state_layer_ids
        if not ids:
            raise ConfigError("DSparkConfig.aux_hidden_state_layer_ids must name at least one layer")
        if len(set(ids)) != len(ids):
            raise ConfigError(f"DSparkConfig.aux_hidden_state_layer_ids has duplicates: {list(ids)}")
        bad = [i for i in ids if not 0 <= i <= self.num_target_layers]
        if bad:
            raise ConfigError(
                f"DSparkConfig.aux_hidden_state_layer_ids {list(ids)}: {bad} outside "
                f"[0, {self.num_target_layers}] for a target with {self.num_target_layers} "
                f"layers (convention: {LAYER_ID_CONVENTION}, id i = HF hidden_states[i])"
            )
        if self.aux_layer_id_convention != LAYER_ID_CONVENTION:
            raise ConfigError(
                f"DSparkConfig.aux_layer_id_convention must be {LAYER_ID_CONVENTION!r}, got "
                f"{self.aux_layer_id_convention!r} (convert ids on import instead)"
            )
        if self.markov_rank < 0:
            raise ConfigError(f"DSparkConfig.markov_rank must be >= 0, got {self.markov_rank}")
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ConfigError(
                f"DSparkConfig.markov_head_type must be one of {MARKOV_HEAD_TYPES}, got {self.markov_head_type!r}"
            )
        if self.enable_confidence_head and self.confidence_head_with_markov and self.markov_rank == 0:
            raise ConfigError(
                "DSparkConfig.confidence_head_with_markov=True needs markov_rank > 0 "
                "(the confidence head reads the Markov embedding of the previous token)"
            )
        if self.drafts_per_block < 1:
            raise ConfigError(
                f"DSparkConfig.block_size={self.block_size} with sample_from_anchor=False "
                "leaves no draft slot; use block_size >= 2"
            )

    # ------------------------------------------------------------------ derived
    @property
    def drafts_per_block(self) -> int:
        """Draft tokens one block yields: B with ``sample_from_anchor``, else B - 1."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    @property
    def method(self) -> str:
        """``dspark`` when either head is present, else ``dflash``."""
        return "dspark" if self.markov_rank > 0 or self.enable_confidence_head else "dflash"

    @property
    def uses_pruned_vocab(self) -> bool:
        return self.draft_vocab_size != self.target_vocab_size

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["aux_hidden_state_layer_ids"] = list(self.aux_hidden_state_layer_ids)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> DSparkConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown DSparkConfig field(s) {unknown}")
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        missing = sorted(required - set(data))
        if missing:
            raise ConfigError(f"{source}: missing DSparkConfig field(s) {missing}")
        try:
            return cls(**data)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except TypeError as exc:  # wrong value types that slipped past the checks
            raise ConfigError(f"{source}: {exc}") from None

    def replace(self, **changes: Any) -> DSparkConfig:
        return dataclasses.replace(self, **changes)
