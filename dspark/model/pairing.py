"""Matching a drafter to a target: a config sized from it, and checking that one fits."""

from __future__ import annotations

import json

import torch

from dspark.defaults import public_target_name
from dspark.errors import IncompatibleDraftError
from dspark.model.config import DSparkConfig
from dspark.target.adapter import TargetModel


def default_aux_layers(num_layers: int) -> list[int]:
    """Three ids spread over the depth (speculators' ``[2, L//2, L-3]`` where it fits)."""
    if num_layers >= 6:
        return [2, num_layers // 2, num_layers - 3]
    ids = sorted({max(1, round(x)) for x in torch.linspace(1, max(1, num_layers - 1), 3).tolist()})
    return ids


def default_mask_token(target: TargetModel) -> tuple[int, str]:
    """An id the target never generates, to fill a block's draft slots, and why it was chosen:

    1. the tokenizer's own mask token;
    2. else the first embedding row past the tokenizer's vocabulary (no text maps to it; the
       z-lab DFlash drafters for Qwen3 use 151669 this way);
    3. else the highest-id added special token that has no role (not bos/eos/pad/unk) and that
       the chat template does not write (SmolLM2: 16, ``<empty_output>``).
    """
    tok = target.tokenizer
    if tok is None:
        raise IncompatibleDraftError(f"{target.name}: no tokenizer to pick a mask token from; pass --mask-token-id")
    mask = getattr(tok, "mask_token_id", None)
    if isinstance(mask, int):
        return mask, f"the tokenizer's mask token {tok.mask_token!r}"
    if len(tok) < target.vocab_size:
        return len(tok), f"the first embedding row past the tokenizer's {len(tok)} tokens"
    roles = {i for i in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) if i is not None}
    template = getattr(tok, "chat_template", None) or ""
    template = template if isinstance(template, str) else json.dumps(template)
    added = getattr(tok, "added_tokens_decoder", {}) or {}
    spare = [
        i
        for i, t in added.items()
        if getattr(t, "special", False) and i not in roles and str(t) not in template and i < target.vocab_size
    ]
    if spare:
        return max(spare), f"the unused special token {str(added[max(spare)])!r} (no role, not in the chat template)"
    raise IncompatibleDraftError(
        f"{target.name}: the tokenizer defines no mask token and has no spare special token; pass "
        "--mask-token-id with an id the target never generates"
    )


def config_for_target(
    target: TargetModel,
    *,
    num_layers: int = 1,
    block_size: int = 8,
    aux_layers: list[int] | None = None,
    mask_token_id: int | None = None,
    markov_rank: int = 256,
    markov_head_type: str = "vanilla",
    enable_confidence_head: bool = True,
    confidence_head_with_markov: bool = True,
    sample_from_anchor: bool = True,
    draft_vocab_size: int | None = None,
) -> DSparkConfig:
    """A drafter config whose sizes are read from the target (errors when they cannot be)."""
    tcfg = target.config
    mask = mask_token_id if mask_token_id is not None else default_mask_token(target)[0]
    heads = int(getattr(tcfg, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(tcfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(tcfg, "head_dim", None) or (target.hidden_size // heads if heads else 0))
    if getattr(tcfg, "kv_lora_rank", None):  # MLA target: its head dims do not suit a GQA drafter
        head_dim = target.hidden_size // heads
        kv_heads = min(8, heads) if heads % min(8, heads) == 0 else heads
    ffn = int(getattr(tcfg, "intermediate_size", 0) or 4 * target.hidden_size)
    if heads <= 0 or head_dim <= 0:
        raise IncompatibleDraftError(f"{target.name}: cannot read attention heads / head_dim from config.json")
    if heads % kv_heads:
        kv_heads = heads
    return DSparkConfig(
        num_hidden_layers=num_layers,
        hidden_size=target.hidden_size,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=ffn,
        draft_vocab_size=draft_vocab_size or target.vocab_size,
        target_vocab_size=target.vocab_size,
        target_hidden_size=target.hidden_size,
        aux_hidden_state_layer_ids=tuple(aux_layers or default_aux_layers(target.num_layers)),
        num_target_layers=target.num_layers,
        block_size=block_size,
        mask_token_id=int(mask),
        sample_from_anchor=sample_from_anchor,
        markov_rank=markov_rank,
        markov_head_type=markov_head_type,
        enable_confidence_head=enable_confidence_head,
        confidence_head_with_markov=confidence_head_with_markov and enable_confidence_head,
        rope_theta=_rope_theta(tcfg),
        rms_norm_eps=float(getattr(tcfg, "rms_norm_eps", None) or 1e-6),
        max_position_embeddings=int(getattr(tcfg, "max_position_embeddings", None) or 32768),
        extra={"target": public_target_name(target.name), "target_architecture": type(target.model).__name__},
    )


def _rope_theta(tcfg) -> float:
    rope = getattr(tcfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    return float(theta or getattr(tcfg, "rope_theta", None) or 10000.0)


def check_fits(config: DSparkConfig, target) -> None:
    """Raise `IncompatibleDraftError` naming every field where drafter and target disagree.

    ``target`` is anything with ``name``, ``hidden_size``, ``vocab_size`` and ``num_layers``: a
    loaded `TargetModel`, the `TargetFacts` export reads, or the `TargetShape` of a config.json
    (so a mismatch is found before either side's weights are read). One check, one wording."""
    problems = []
    if config.target_hidden_size != target.hidden_size:
        problems.append(f"hidden size: drafter expects {config.target_hidden_size}, target has {target.hidden_size}")
    if config.target_vocab_size != target.vocab_size:
        problems.append(f"vocab size: drafter expects {config.target_vocab_size}, target has {target.vocab_size}")
    if config.num_target_layers != target.num_layers:
        problems.append(
            f"layer count: drafter was built for {config.num_target_layers} target layers, "
            f"target has {target.num_layers}"
        )
    bad = [i for i in config.aux_hidden_state_layer_ids if not 0 <= i <= target.num_layers]
    if bad:
        problems.append(
            f"aux layer ids {list(config.aux_hidden_state_layer_ids)}: {bad} outside [0, {target.num_layers}]"
        )
    mask = getattr(config, "mask_token_id", None)  # block drafters fill their draft slots with it
    if mask is not None and not 0 <= mask < target.vocab_size:
        problems.append(f"mask_token_id {mask} outside the target vocab")
    if problems:
        raise IncompatibleDraftError(f"drafter does not fit target {target.name}: " + "; ".join(problems))
