"""The drafter's training forward: all anchored blocks of one sequence in one pass."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.model.dspark import DSparkDraftModel
from dspark.training.blocks import BlockTargets, block_attention_mask, block_targets


@dataclass
class BlockOutputs:
    logits: torch.Tensor  # [N, D, V_d] fp32, Markov bias included (teacher forced)
    confidence_logits: torch.Tensor | None  # [N, D]
    targets: BlockTargets


def block_forward(
    model: DSparkDraftModel,
    aux_hidden: torch.Tensor,  # [T, m·H]
    input_ids: torch.Tensor,  # [T]
    loss_mask: torch.Tensor,  # [T]
    document_ids: torch.Tensor,  # [T]
    anchors: torch.Tensor,  # [N]
) -> BlockOutputs:
    cfg = model.config
    device = model.fc.weight.device
    b, d = cfg.block_size, cfg.drafts_per_block
    n, t = anchors.shape[0], input_ids.shape[0]
    ctx = model.project_context(aux_hidden.to(device)[None])  # [1, T, H]
    ctx_kv = model.context_kv(ctx, torch.arange(t, device=device))
    block_ids = model.block_input_ids(input_ids[anchors].to(device))  # [N, B]
    positions = (anchors[:, None] + torch.arange(b)[None, :]).reshape(-1).to(device)
    mask = block_attention_mask(anchors, document_ids, b).to(device)
    hidden = model.backbone(block_ids.reshape(1, n * b), positions, ctx_kv, attn_mask=mask)
    hidden = hidden.view(n, b, -1)
    first = 0 if cfg.sample_from_anchor else 1
    slots = hidden[:, first : first + d]  # [N, D, H]
    targets = block_targets(anchors, input_ids, loss_mask, document_ids, d)
    prev = targets.prev_ids.to(device)
    logits = model.base_logits(slots)
    prev_emb = model.prev_embedding(prev)
    if model.markov_head is not None:
        logits = logits + model.markov_head.block_bias(prev, slots).float()
    conf = model.confidence_logit(slots, prev_emb) if model.confidence_head is not None else None
    return BlockOutputs(logits=logits, confidence_logits=conf, targets=targets)


def eagle3_forward(
    model,
    aux_hidden: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    document_ids: torch.Tensor,
    anchors: torch.Tensor,
) -> BlockOutputs:
    """EAGLE-3's training-time test over the same anchors and targets as a DSpark block:
    chain k predicts the token at p+k+1 from its own unrolled hidden states."""
    from dspark.model.eagle3 import train_forward

    # A chain starts from the feature before its anchor, which must be in the same document.
    keep = (anchors >= 1) & (document_ids[(anchors - 1).clamp_min(0)] == document_ids[anchors])
    anchors = anchors[keep]
    targets = block_targets(anchors, input_ids, loss_mask, document_ids, model.config.drafts_per_block)
    logits = train_forward(model, aux_hidden, input_ids, document_ids, anchors, targets.prev_ids)
    return BlockOutputs(logits=logits, confidence_logits=None, targets=targets)
