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
