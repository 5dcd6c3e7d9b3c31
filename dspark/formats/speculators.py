"""The speculators checkpoint format: our native save format (DESIGN §4).

A drafter directory holds ``config.json`` and one ``model.safetensors`` laid out as the
``speculators`` package (PyPI 0.9.0, ``speculators/models/dspark`` and ``models/dflash``)
defines them, so vLLM's ``dspark`` method and ``speculators`` load it as it is:

- ``speculators_model_type`` ``"dspark"`` (``"dflash"`` for a drafter without heads),
  ``architectures`` ``["DSparkSpeculator"]`` / ``["DFlashSpeculator"]``;
- ``transformer_layer_config``: a Qwen3 config of the draft backbone; its ``vocab_size``
  is the *target* vocab (speculators reads ``target_vocab_size`` from it);
- the DFlash fields (``draft_vocab_size``, ``block_size``, ``target_hidden_size``,
  ``aux_hidden_state_layer_ids`` — id ``i`` = HF ``hidden_states[i]`` —, ``mask_token_id``,
  ``sliding_window_non_causal``, ``sample_from_anchor`` written explicitly) and the DSpark
  fields (``markov_rank``, ``markov_head_type``, ``enable_confidence_head``,
  ``confidence_head_with_markov``);
- ``speculators_config``: algorithm, a greedy proposal with ``speculative_tokens``, and the
  verifier (``name_or_path``, ``architectures``).

Fields speculators has no name for (the target's layer count, ``apply_verifier_norm``,
provenance) live under the extra key ``"dspark"``; speculators' config allows extra keys.
Tensor names are the speculators ones; `TENSOR_NAME_MAP` states it per tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dspark.errors import ConfigError
from dspark.model.config import LAYER_ID_CONVENTION, DSparkConfig
from dspark.model.eagle3 import Eagle3Config

CONFIG_NAME = "config.json"
LEGACY_CONFIG_NAME = "dspark_config.json"
SPECULATORS_VERSION = "0.9.0"

# Our state-dict name -> the speculators name (None = not written on purpose). Per-layer
# names are given for layer 0 and hold for every layer index.
TENSOR_NAME_MAP: dict[str, str | None] = {
    "embed_tokens.weight": "embed_tokens.weight",  # optional: speculators takes it from the verifier
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "hidden_norm.weight",
    "layers.0.input_layernorm.weight": "layers.0.input_layernorm.weight",
    "layers.0.self_attn.q_proj.weight": "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight": "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight": "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight": "layers.0.self_attn.o_proj.weight",
    "layers.0.self_attn.q_norm.weight": "layers.0.self_attn.q_norm.weight",
    "layers.0.self_attn.k_norm.weight": "layers.0.self_attn.k_norm.weight",
    "layers.0.post_attention_layernorm.weight": "layers.0.post_attention_layernorm.weight",
    "layers.0.mlp.gate_proj.weight": "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight": "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight": "layers.0.mlp.down_proj.weight",
    "norm.weight": "norm.weight",
    # Draft-vocab rows of the verifier's lm_head (ascending target ids). Speculators
    # stores it only for a pruned vocab; with the full vocab it is the verifier's own.
    "lm_head.weight": "lm_head.weight",
    "markov_head.markov_w1.weight": "markov_head.markov_w1.weight",
    "markov_head.markov_w2.weight": "markov_head.markov_w2.weight",
    "markov_head.gate_proj.weight": "markov_head.gate_proj.weight",
    "markov_head.gate_proj.bias": "markov_head.gate_proj.bias",
    "markov_head.joint_proj.weight": "markov_head.joint_proj.weight",
    "markov_head.joint_proj.bias": "markov_head.joint_proj.bias",
    "confidence_head.proj.weight": "confidence_head.proj.weight",
    "confidence_head.proj.bias": "confidence_head.proj.bias",
    # Vocab tables: d2t int64 offsets, t2d bool; speculators has none for a full vocab.
    "d2t": "d2t",
    "t2d": "t2d",
}
# Speculators tensors we never read: rebuilt from the verifier at load time.
SPECULATORS_IGNORED = ("verifier_lm_head.weight", "verifier_norm.weight", "rotary_emb.inv_freq")


def speculators_method(config: DSparkConfig) -> str:
    return config.method  # "dspark" with either head, else "dflash"


def to_speculators_dict(config: DSparkConfig) -> dict[str, Any]:
    """The ``config.json`` speculators writes for this drafter."""
    method = speculators_method(config)
    verifier = config.extra.get("target")
    architectures = config.extra.get("target_architecture")
    extra = {k: v for k, v in config.extra.items() if k not in ("target", "target_architecture")}
    return {
        "architectures": ["DSparkSpeculator" if method == "dspark" else "DFlashSpeculator"],
        "speculators_model_type": method,
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": {
            "model_type": "qwen3",
            "vocab_size": config.target_vocab_size,
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": config.max_position_embeddings,
            "rms_norm_eps": config.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "attention_bias": False,
            "tie_word_embeddings": False,
        },
        "draft_vocab_size": config.draft_vocab_size,
        "block_size": config.block_size,
        "target_hidden_size": config.target_hidden_size,
        "aux_hidden_state_layer_ids": list(config.aux_hidden_state_layer_ids),
        "mask_token_id": config.mask_token_id,
        # True: the draft block attends bidirectionally. vLLM reads this field as
        # `dflash_config.causal = not sliding_window_non_causal` (vllm/transformers_utils/configs/
        # speculators/algos.py, update_dflash), so `false` would make it run the block causally;
        # speculators applies it to sliding-window layers only (its full-attention layers are
        # always bidirectional), and we have none.
        "sliding_window_non_causal": True,
        "sample_from_anchor": config.sample_from_anchor,
        "markov_rank": config.markov_rank,
        "markov_head_type": config.markov_head_type,
        "enable_confidence_head": config.enable_confidence_head,
        "confidence_head_with_markov": config.confidence_head_with_markov,
        "speculators_config": {
            "algorithm": method,
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": config.drafts_per_block,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": verifier,
                "architectures": [architectures] if architectures else [],
            },
        },
        # Ours: fields speculators has no name for.
        "dspark": {
            "num_target_layers": config.num_target_layers,
            "apply_verifier_norm": config.apply_verifier_norm,
            "aux_layer_id_convention": LAYER_ID_CONVENTION,
            "extra": extra,
        },
    }


def _rope_theta(layer: dict[str, Any], source: str) -> float:
    params = layer.get("rope_parameters") or layer.get("rope_scaling") or {}
    if isinstance(params, dict) and params.get("rope_type", "default") not in ("default", None):
        raise ConfigError(f"{source}: rope_type {params.get('rope_type')!r} is not supported (only default RoPE)")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    theta = theta if theta is not None else layer.get("rope_theta")
    if theta is None:
        raise ConfigError(f"{source}: transformer_layer_config has no rope_theta / rope_parameters.rope_theta")
    return float(theta)


def from_speculators_dict(
    data: dict[str, Any], *, source: str = CONFIG_NAME, num_target_layers: int | None = None
) -> DSparkConfig:
    """Read a speculators ``dspark`` / ``dflash`` config into a `DSparkConfig`.

    ``num_target_layers`` is needed for a checkpoint written by another tool (ours carry it
    under ``"dspark"``); it comes from the target the drafter will run with."""
    kind = data.get("speculators_model_type")
    if kind not in ("dspark", "dflash"):
        raise ConfigError(
            f"{source}: speculators_model_type {kind!r} is not supported (expected 'dspark', 'dflash' or 'eagle3')"
        )
    layer = data.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ConfigError(f"{source}: transformer_layer_config is missing or not an object")
    ours = data.get("dspark") or {}
    if not isinstance(ours, dict):
        raise ConfigError(f"{source}: the 'dspark' entry must be an object")
    n_target = ours.get("num_target_layers", num_target_layers)
    if n_target is None:
        raise ConfigError(
            f"{source}: written by another tool, it does not say how many layers the target has; "
            "pass the target (--target DIR) so the layer ids can be checked"
        )
    for key in ("draft_vocab_size", "aux_hidden_state_layer_ids"):
        if data.get(key) is None:
            raise ConfigError(f"{source}: required field {key!r} is missing")
    if data.get("mask_token_id") is None:
        raise ConfigError(f"{source}: mask_token_id is missing (DFlash drafting needs it)")
    if "sample_from_anchor" not in data:
        raise ConfigError(
            f"{source}: sample_from_anchor is missing; its default differs between tools (speculators: true, "
            "vLLM 0.32's loader and llama.cpp's converter: false), so it must be stated"
        )
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if layer.get(key) is None:
            raise ConfigError(f"{source}: transformer_layer_config.{key} is missing")
    if layer.get("attention_bias"):
        raise ConfigError(f"{source}: attention_bias=true is not supported (Qwen3 layers have none)")
    if layer.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{source}: hidden_act {layer.get('hidden_act')!r} is not supported (only silu)")
    # sliding_window_non_causal only concerns sliding-window layers (speculators' reading);
    # our draft layers are full attention, bidirectional within the block, whatever it says.
    if layer.get("layer_types") and any(t != "full_attention" for t in layer["layer_types"]):
        raise ConfigError(f"{source}: sliding-window draft layers are not supported")
    hidden = int(layer["hidden_size"])
    heads = int(layer["num_attention_heads"])
    is_dspark = kind == "dspark"
    fields = {
        "num_hidden_layers": int(layer["num_hidden_layers"]),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": int(layer.get("num_key_value_heads") or heads),
        "head_dim": int(layer.get("head_dim") or hidden // heads),
        "intermediate_size": int(layer["intermediate_size"]),
        "draft_vocab_size": int(data["draft_vocab_size"]),
        "target_vocab_size": int(layer["vocab_size"]),
        "target_hidden_size": int(data.get("target_hidden_size") or hidden),
        "aux_hidden_state_layer_ids": tuple(int(i) for i in data["aux_hidden_state_layer_ids"]),
        "num_target_layers": int(n_target),
        "block_size": int(data.get("block_size", 8)),
        "mask_token_id": int(data["mask_token_id"]),
        "sample_from_anchor": bool(data["sample_from_anchor"]),
        "markov_rank": int(data.get("markov_rank", 256)) if is_dspark else 0,
        "markov_head_type": data.get("markov_head_type", "vanilla") if is_dspark else "vanilla",
        "enable_confidence_head": bool(data.get("enable_confidence_head", True)) if is_dspark else False,
        "confidence_head_with_markov": bool(data.get("confidence_head_with_markov", True)),
        "rope_theta": _rope_theta(layer, source),
        "rms_norm_eps": float(layer.get("rms_norm_eps", 1e-6)),
        "max_position_embeddings": int(layer.get("max_position_embeddings", 32768)),
        "apply_verifier_norm": bool(ours.get("apply_verifier_norm", False)),
    }
    extra = dict(ours.get("extra") or {})
    verifier = (data.get("speculators_config") or {}).get("verifier") or {}
    if verifier.get("name_or_path"):
        extra["target"] = verifier["name_or_path"]
    if verifier.get("architectures"):
        extra["target_architecture"] = verifier["architectures"][0]
    try:
        return DSparkConfig(**fields, extra=extra)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {exc}") from None


def require_fields(data: dict[str, Any], path: str | Path, keys: tuple[str, ...], why: str) -> list[str]:
    """Each of ``keys`` present and not null in a config.json, or `DSparkError` naming the first
    missing one and ``why`` it matters; returns the checks done, for a report."""
    from dspark.errors import DSparkError

    for key in keys:
        if data.get(key) is None:
            raise DSparkError(f"{path}: field {key!r} is missing; {why}")
    return [f"{key} present" for key in keys]


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def eagle3_to_speculators_dict(config: Eagle3Config) -> dict[str, Any]:
    """The speculators ``eagle3`` config.json of an `Eagle3Config` (Llama decoder layer)."""
    verifier = config.extra.get("target")
    architectures = config.extra.get("target_architecture")
    extra = {k: v for k, v in config.extra.items() if k not in ("target", "target_architecture")}
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": {
            "model_type": "llama",
            "vocab_size": config.target_vocab_size,
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": config.max_position_embeddings,
            "rms_norm_eps": config.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
        },
        "draft_vocab_size": config.draft_vocab_size,
        "norm_before_residual": False,
        "target_hidden_size": config.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(config.aux_hidden_state_layer_ids),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": config.speculative_steps,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": [architectures] if architectures else []},
        },
        "dspark": {
            "num_target_layers": config.num_target_layers,
            "aux_layer_id_convention": LAYER_ID_CONVENTION,
            "extra": extra,
        },
    }


def eagle3_from_speculators_dict(
    data: dict[str, Any], *, source: str, num_target_layers: int | None = None
) -> Eagle3Config:
    layer = data.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ConfigError(f"{source}: transformer_layer_config is missing or not an object")
    ours = data.get("dspark") or {}
    n_target = ours.get("num_target_layers", num_target_layers)
    if n_target is None:
        raise ConfigError(f"{source}: does not say how many layers the target has; pass the target (--target DIR)")
    for key in ("draft_vocab_size", "eagle_aux_hidden_state_layer_ids"):
        if data.get(key) is None:
            raise ConfigError(f"{source}: required field {key!r} is missing")
    for flag in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        if data.get(flag):
            raise ConfigError(f"{source}: {flag}=true is not supported")
    if layer.get("model_type", "llama") != "llama" or layer.get("attention_bias") or layer.get("mlp_bias"):
        raise ConfigError(f"{source}: only Llama-style eagle3 layers without biases are supported")
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise ConfigError(f"{source}: only one eagle3 decoder layer is supported")
    hidden, heads = int(layer["hidden_size"]), int(layer["num_attention_heads"])
    methods = (data.get("speculators_config") or {}).get("proposal_methods") or [{}]
    extra = dict(ours.get("extra") or {})
    verifier = (data.get("speculators_config") or {}).get("verifier") or {}
    if verifier.get("name_or_path"):
        extra["target"] = verifier["name_or_path"]
    if verifier.get("architectures"):
        extra["target_architecture"] = verifier["architectures"][0]
    try:
        return Eagle3Config(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or hidden // heads),
            intermediate_size=int(layer["intermediate_size"]),
            draft_vocab_size=int(data["draft_vocab_size"]),
            target_vocab_size=int(layer["vocab_size"]),
            target_hidden_size=int(data.get("target_hidden_size") or hidden),
            aux_hidden_state_layer_ids=tuple(int(i) for i in data["eagle_aux_hidden_state_layer_ids"]),
            num_target_layers=int(n_target),
            speculative_steps=int(methods[0].get("speculative_tokens", 7)),
            rope_theta=_rope_theta(layer, source),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(layer.get("max_position_embeddings", 32768)),
            extra=extra,
        )
    except (ConfigError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {exc}") from None
