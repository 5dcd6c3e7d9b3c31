"""Anchor sampling and the many-blocks-one-forward layout of DSpark training (DESIGN §2).

Every sampled anchor p opens one block of B slots (the token at p, then B-1 mask tokens,
at positions p..p+B-1). All blocks of a sequence run through the drafter in one forward:
queries are the N·B block slots; keys are the T context features followed by the N·B
block slots. A block sees context features strictly before its anchor, in its own
document only, and its own block bidirectionally.

Draft index k (0-based) of a block predicts the token at p+k+1 in both slot layouts; it
sits in slot k (``sample_from_anchor``) or slot k+1 (DFlash layout).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def sample_anchors(
    loss_mask: torch.Tensor,  # [T] bool: assistant tokens
    document_ids: torch.Tensor,  # [T]
    max_anchors: int,
    drafts_per_block: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Sorted anchor positions [N <= max_anchors] whose first predicted token is a loss token
    and whose whole block (p+1 .. p+drafts) lies inside the sequence and the anchor's document."""
    t = loss_mask.shape[0]
    last = t - 1 - drafts_per_block  # p + drafts_per_block <= T - 1
    if last < 0:
        return torch.empty(0, dtype=torch.long)
    p = torch.arange(last + 1)
    ok = loss_mask[p + 1].bool() & (document_ids[p + drafts_per_block] == document_ids[p])
    candidates = p[ok]
    if candidates.numel() > max_anchors:
        pick = torch.randperm(candidates.numel(), generator=generator)[:max_anchors]
        candidates = candidates[pick]
    return torch.sort(candidates).values


def block_attention_mask(
    anchors: torch.Tensor,  # [N]
    document_ids: torch.Tensor,  # [T]
    block_size: int,
) -> torch.Tensor:
    """Bool mask [N·B, T + N·B]; True = may attend."""
    n, t = anchors.shape[0], document_ids.shape[0]
    q_anchor = anchors.repeat_interleave(block_size)  # [N·B]
    ctx_pos = torch.arange(t)
    ctx = (ctx_pos[None, :] < q_anchor[:, None]) & (document_ids[None, :] == document_ids[q_anchor][:, None])
    q_block = torch.arange(n * block_size) // block_size
    own = q_block[:, None] == q_block[None, :]
    return torch.cat([ctx, own], dim=1)


@dataclass
class BlockTargets:
    """Per block and draft index k: what draft k must predict, and whether it counts."""

    label_ids: torch.Tensor  # [N, D] target ids of the tokens at p+k+1
    prev_ids: torch.Tensor  # [N, D] target ids at p+k (teacher-forced Markov input)
    target_rows: torch.Tensor  # [N, D] positions whose target logits score p+k+1 (= p+k)
    valid: torch.Tensor  # [N, D] bool, cumulative valid-prefix mask


def block_targets(
    anchors: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, document_ids: torch.Tensor, drafts: int
) -> BlockTargets:
    t = input_ids.shape[0]
    k = torch.arange(drafts)
    label_pos = anchors[:, None] + k[None, :] + 1  # [N, D]
    inside = label_pos < t
    safe = label_pos.clamp(max=t - 1)
    valid = inside & loss_mask[safe].bool() & (document_ids[safe] == document_ids[anchors][:, None])
    valid = torch.cumprod(valid.to(torch.int8), dim=1).bool()
    return BlockTargets(
        label_ids=input_ids[safe],
        prev_ids=input_ids[safe - 1],
        target_rows=safe - 1,
        valid=valid,
    )
