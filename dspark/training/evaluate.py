"""Teacher-forced evaluation: the "simulated accept_len" training-style metrics predict."""

from __future__ import annotations

import torch

from dspark.model.dspark import DSparkDraftModel
from dspark.model.vocab import target_to_draft_ids
from dspark.training.blocks import sample_anchors
from dspark.training.data import extract_features
from dspark.training.forward import block_forward
from dspark.training.losses import LossWeights, dspark_loss


@torch.no_grad()
def simulated_accept_len(model: DSparkDraftModel, target, examples, *, max_anchors: int = 64, seed: int = 0) -> dict:
    """Mean over examples of 1 + Σ_k Π_{i<=k} [draft_i == target argmax_i], teacher forced."""
    was_training = model.training
    model.eval()
    t2d_ids = target_to_draft_ids(model.t2d).cpu()
    taus, tvs = [], []
    for i, ex in enumerate(examples):
        batch = extract_features(target, ex, model.config.aux_hidden_state_layer_ids, i)
        gen = torch.Generator().manual_seed(seed + i)
        anchors = sample_anchors(batch.loss_mask, batch.document_ids, max_anchors, model.config.drafts_per_block, gen)
        if anchors.numel() == 0:
            continue
        out = block_forward(model, batch.aux_hidden, batch.input_ids, batch.loss_mask, batch.document_ids, anchors)
        target_logits = model.base_logits(batch.last_hidden[out.targets.target_rows].to(model.fc.weight.device))
        _, metrics = dspark_loss(
            out.logits, target_logits, t2d_ids[out.targets.label_ids], out.targets.valid, None, LossWeights()
        )
        taus.append(float(metrics["sim_accept_len"]))
        tvs.append(metrics["tv"])
    model.train(was_training)
    return {
        "sim_accept_len": sum(taus) / len(taus) if taus else 1.0,
        "tv_per_position": torch.stack(tvs).mean(0).tolist() if tvs else [],
    }
