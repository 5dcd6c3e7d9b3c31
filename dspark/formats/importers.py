"""Import drafters written by other tools into our (speculators) format.

- ``speculators``: a speculators ``dspark`` / ``dflash`` directory (``config.json`` with
  ``speculators_model_type``). Frozen copies it leaves out come from the target.
- ``dflash``: a z-lab DFlash checkpoint: a Qwen3 ``config.json`` with ``block_size`` and
  ``dflash_config`` (``target_layer_ids``, ``mask_token_id``), weights without
  ``embed_tokens`` / ``lm_head`` (the verifier's). Read as DSpark with ``markov_rank=0``, no
  confidence head, ``sample_from_anchor=false`` (the DFlash layout).
- ``deepspec``: a DeepSpec DSpark checkpoint: a flat Qwen3 ``config.json`` plus
  ``target_layer_ids``, ``mask_token_id``, ``block_size``, ``draft_vocab_size``,
  ``markov_rank``, ``markov_head_type`` (``dflash_config`` may hold the first two);
  ``sample_from_anchor`` defaults to true there.

Layer ids: DeepSpec / z-lab ``target_layer_ids`` index HF ``hidden_states[id + 1]``; ours
(speculators) are those ids + 1. A ``model.`` prefix on tensor names is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from dspark.errors import CheckpointError, ConfigError
from dspark.formats.speculators import CONFIG_NAME, _rope_theta, from_speculators_dict, read_json
from dspark.model.config import DSparkConfig
from dspark.model.dspark import DSparkDraftModel

SOURCES = ("speculators", "dflash", "deepspec")


def read_state(directory: Path) -> dict[str, torch.Tensor]:
    """All ``*.safetensors`` in ``directory`` merged, ``model.`` prefixes dropped."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            part = load_file(str(path))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: cannot read safetensors file (truncated or corrupt?): {exc}") from None
        for name, tensor in part.items():
            state[name.removeprefix("model.")] = tensor
    return state


def _flat_config(
    data: dict[str, Any], state: dict[str, torch.Tensor], *, kind: str, source: str, num_target_layers: int | None
) -> DSparkConfig:
    inner = data.get("dflash_config") or {}
    layer_ids = inner.get("target_layer_ids", data.get("target_layer_ids"))
    if layer_ids is None:
        raise ConfigError(f"{source}: no target_layer_ids (top level or in dflash_config)")
    mask = inner.get("mask_token_id", data.get("mask_token_id"))
    if mask is None:
        raise ConfigError(f"{source}: no mask_token_id (top level or in dflash_config)")
    block = data.get("block_size") or inner.get("block_size")
    if block is None:
        raise ConfigError(f"{source}: no block_size (top level or in dflash_config)")
    n_target = data.get("num_target_layers", num_target_layers)
    if n_target is None:
        raise ConfigError(f"{source}: the target's layer count is unknown; pass the target (--target DIR)")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        if data.get(key) is None:
            raise ConfigError(f"{source}: required field {key!r} is missing")
    hidden, heads = int(data["hidden_size"]), int(data["num_attention_heads"])
    dspark = kind == "deepspec"
    rank = 0
    if dspark:
        w1 = state.get("markov_head.markov_w1.weight")
        rank = int(data.get("markov_rank", w1.shape[1] if w1 is not None else 0))
    conf = dspark and "confidence_head.proj.weight" in state
    conf_markov = bool(conf and state["confidence_head.proj.weight"].shape[1] == hidden + rank)
    return DSparkConfig(
        num_hidden_layers=int(data["num_hidden_layers"]),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=int(data.get("num_key_value_heads") or heads),
        head_dim=int(data.get("head_dim") or hidden // heads),
        intermediate_size=int(data["intermediate_size"]),
        draft_vocab_size=int(data.get("draft_vocab_size") or data["vocab_size"]),
        target_vocab_size=int(data["vocab_size"]),
        target_hidden_size=int(data.get("target_hidden_size") or hidden),
        aux_hidden_state_layer_ids=tuple(int(i) + 1 for i in layer_ids),
        num_target_layers=int(n_target),
        block_size=int(block),
        mask_token_id=int(mask),
        sample_from_anchor=bool(data.get("sample_from_anchor", dspark)),
        markov_rank=rank,
        markov_head_type=data.get("markov_head_type", "vanilla") if dspark else "vanilla",
        enable_confidence_head=conf,
        confidence_head_with_markov=conf_markov,
        rope_theta=_rope_theta(data, source),
        rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(data.get("max_position_embeddings", 32768)),
        extra={"imported_from": kind},
    )


def import_drafter(
    src: str | Path,
    kind: str,
    *,
    num_target_layers: int | None = None,
    target_embedding: torch.Tensor | None = None,
    target_lm_head: torch.Tensor | None = None,
    log: Callable[[str], None] = lambda _msg: None,
) -> DSparkDraftModel:
    """Read a checkpoint of ``kind`` (one of `SOURCES`) into our drafter, validated."""
    from dspark.formats.checkpoint import build_drafter

    if kind not in SOURCES:
        raise CheckpointError(f"--from {kind!r}: choose from {', '.join(SOURCES)}")
    directory = Path(src)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: checkpoint directory not found")
    config_path = directory / CONFIG_NAME
    if not config_path.is_file():
        raise CheckpointError(f"{directory}: no {CONFIG_NAME}")
    try:
        data = read_json(config_path)
        state = read_state(directory)
        if kind == "speculators":
            if "speculators_model_type" not in data:
                raise ConfigError(f"{config_path}: not a speculators config (no speculators_model_type)")
            config = from_speculators_dict(data, source=str(config_path), num_target_layers=num_target_layers)
        else:
            if "speculators_model_type" in data:
                raise ConfigError(f"{config_path}: this is a speculators checkpoint; use --from speculators")
            config = _flat_config(data, state, kind=kind, source=str(config_path), num_target_layers=num_target_layers)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    if kind == "dflash":
        for name in [n for n in state if n.startswith(("markov_head.", "confidence_head."))]:
            raise CheckpointError(f"{directory}: tensor {name} in a DFlash checkpoint; use --from deepspec")
    log(
        f"{kind}: {config.method}, {config.num_hidden_layers} layers, block {config.block_size}, "
        f"aux ids {list(config.aux_hidden_state_layer_ids)} (speculators convention)"
    )
    return build_drafter(
        config, state, source=str(directory), target_embedding=target_embedding, target_lm_head=target_lm_head
    )
