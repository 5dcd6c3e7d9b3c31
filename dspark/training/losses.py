"""The DSpark loss and its per-position metrics.

Per draft index k (0-based: the first drafted token is k = 0 in both slot layouts):
``w_k · (ce_weight·CE + tv_weight·TV + alpha·BCE(c_k, 1 - TV))``, normalised by the sum of
``w_k`` over valid slots, ``w_k = exp(-k / gamma)``. TV is the total variation
``0.5·||p_d - p_t||_1`` (not the L1 distance some codebases weight instead).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LossWeights:
    ce: float = 0.1
    tv: float = 0.9
    confidence: float = 1.0
    gamma: float = 4.0


def dspark_loss(
    logits: torch.Tensor,  # [N, D, V_d] drafter logits
    target_logits: torch.Tensor,  # [N, D, V_d] target logits restricted to the draft vocab
    label_draft_ids: torch.Tensor,  # [N, D] label as a draft id, -1 when pruned from the draft vocab
    valid: torch.Tensor,  # [N, D] bool
    confidence_logits: torch.Tensor | None,  # [N, D]
    weights: LossWeights,
    *,
    with_metrics: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss and its metrics; ``with_metrics=False``: the loss alone (``{"loss": ...}``),
    which saves the per-slot argmaxes and the calibration error on steps nobody logs."""
    n, d, _ = logits.shape
    k = torch.arange(d, device=logits.device, dtype=torch.float32)
    w = torch.exp(-k / weights.gamma)[None, :] * valid.float()  # [N, D]
    norm = w.sum().clamp_min(1e-8)
    logq = torch.log_softmax(logits.float(), dim=-1)
    p_t = torch.softmax(target_logits.float(), dim=-1)
    tv = 0.5 * (logq.exp() - p_t).abs().sum(-1)  # [N, D]
    in_vocab = label_draft_ids >= 0
    ce = -logq.gather(-1, label_draft_ids.clamp_min(0)[..., None])[..., 0] * in_vocab.float()
    per_slot = weights.ce * ce + weights.tv * tv
    bce = None
    if confidence_logits is not None:
        c_star = (1.0 - tv).detach()
        bce = F.binary_cross_entropy_with_logits(confidence_logits.float(), c_star, reduction="none")
        per_slot = per_slot + weights.confidence * bce
    loss = (per_slot * w).sum() / norm
    if not with_metrics:
        return loss, {"loss": loss.detach()}
    with torch.no_grad():
        vf = valid.float()
        count = vf.sum(0).clamp_min(1.0)  # per position
        accept = (logits.argmax(-1) == target_logits.argmax(-1)).float() * vf
        survive = torch.cumprod(accept + (1 - vf), dim=1) * vf  # teacher-forced greedy acceptance
        metrics = {
            "loss": loss.detach(),
            "tv": (tv * vf).sum(0) / count,
            "ce": (ce * vf).sum(0) / count,
            "accept": accept.sum(0) / count,  # P(draft k == target argmax)
            "sim_accept_len": 1.0 + survive.sum(1).mean() if n else torch.tensor(1.0),
            "valid_slots": vf.sum(),
        }
        if bce is not None:
            metrics["confidence_bce"] = (bce * vf).sum(0) / count
            metrics["confidence_ece"] = expected_calibration_error(
                torch.sigmoid(confidence_logits.float())[valid], (1.0 - tv)[valid]
            )
    return loss, metrics


def expected_calibration_error(pred: torch.Tensor, target: torch.Tensor, bins: int = 10) -> torch.Tensor:
    """ECE of predicted acceptance vs the (soft) observed one: Σ_b |B|/n · |mean pred - mean target|."""
    if pred.numel() == 0:
        return torch.tensor(0.0)
    idx = (pred * bins).long().clamp(max=bins - 1)
    total = torch.zeros(bins).index_add_(0, idx.cpu(), torch.ones_like(pred).cpu())
    p_sum = torch.zeros(bins).index_add_(0, idx.cpu(), pred.cpu())
    t_sum = torch.zeros(bins).index_add_(0, idx.cpu(), target.cpu())
    nz = total > 0
    return ((p_sum[nz] - t_sum[nz]).abs()).sum() / pred.numel()
