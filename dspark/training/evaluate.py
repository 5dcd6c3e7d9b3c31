"""Teacher-forced evaluation: the "simulated accept_len" training-style metrics predict.

Every block (an EAGLE-3 chain) is drafted from the target's own features and the true prefix
(teacher forced), so the figures say how far a drafter's proposals match the target's greedy choices without running
speculative decoding. Real decoding drafts from the same states, so greedy ``accept_len`` in
`dspark bench` on the same kind of text comes out close; on other text it can differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dspark.families import training_forward
from dspark.model.dspark import DSparkDraftModel
from dspark.training.blocks import sample_anchors
from dspark.training.data import Example, extract_features


class _Tally:
    """Running sums of one drafter's teacher-forced figures."""

    def __init__(self, model: DSparkDraftModel, num_drafts: int | None) -> None:
        self.model = model
        self.forward = training_forward(model.config)
        d = model.config.drafts_per_block
        if num_drafts is not None:
            if not 1 <= num_drafts <= d:
                raise ValueError(f"num_drafts {num_drafts}: this drafter drafts 1..{d} tokens per block")
            d = num_drafts
        self.d = d
        self.survive, self.match, self.tv, self.valid = (torch.zeros(d, dtype=torch.float64) for _ in range(4))
        self.blocks = self.sequences = 0

    def add(self, batch, anchors: torch.Tensor) -> None:
        model, d = self.model, self.d
        out = self.forward(model, batch.aux_hidden, batch.input_ids, batch.loss_mask, batch.document_ids, anchors)
        rows = batch.last_hidden[out.targets.target_rows].to(model.fc.weight.device)
        target_logits = model.base_logits(rows).float().cpu()[:, :d]
        logits = out.logits.float().cpu()[:, :d]
        valid = out.targets.valid.cpu()[:, :d]
        vf = valid.double()
        match = (logits.argmax(-1) == target_logits.argmax(-1)) & valid
        survive = torch.cumprod(match.double() + (1 - vf), dim=1) * vf
        tv = 0.5 * (torch.softmax(logits, -1) - torch.softmax(target_logits, -1)).abs().sum(-1)
        self.survive += survive.sum(0)
        self.match += match.double().sum(0)
        self.tv += (tv.double() * vf).sum(0)
        self.valid += vf.sum(0)
        self.blocks += logits.shape[0]
        self.sequences += 1

    def report(self) -> dict:
        if self.blocks == 0:
            return {
                "sim_accept_len": 1.0,
                "per_position_acceptance": [],
                "per_position_match": [],
                "tv_per_position": [],
                "sequences": 0,
                "blocks": 0,
            }
        count = self.valid.clamp_min(1.0)
        return {
            "sim_accept_len": 1.0 + float(self.survive.sum()) / self.blocks,
            "per_position_acceptance": (self.survive / self.blocks).tolist(),
            "per_position_match": (self.match / count).tolist(),
            "tv_per_position": (self.tv / count).tolist(),
            "sequences": self.sequences,
            "blocks": self.blocks,
        }


@torch.no_grad()
def simulated_accept_len_many(
    models: Sequence[DSparkDraftModel],
    target,
    examples: Sequence[Example],
    *,
    max_anchors: int = 64,
    num_drafts: int | None = None,
    seed: int = 0,
    on_example: Callable[[], None] | None = None,
) -> list[dict]:
    """`simulated_accept_len` of several drafters on the same rows and blocks: the target runs
    once per row (per distinct set of aux layers), so comparing drafters costs little more
    than evaluating one."""
    tallies = [_Tally(m, num_drafts) for m in models]
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        for i, ex in enumerate(examples):
            feats: dict[tuple, object] = {}
            for tally in tallies:
                cfg = tally.model.config
                aux = tuple(cfg.aux_hidden_state_layer_ids)
                if aux not in feats:
                    feats[aux] = extract_features(target, ex, aux, i)
                batch = feats[aux]
                gen = torch.Generator().manual_seed(seed + i)
                anchors = sample_anchors(batch.loss_mask, batch.document_ids, max_anchors, cfg.drafts_per_block, gen)
                if anchors.numel():
                    tally.add(batch, anchors)
            if on_example is not None:
                on_example()
    finally:
        for m, mode in zip(models, modes, strict=True):
            m.train(mode)
    return [t.report() for t in tallies]


def simulated_accept_len(
    model: DSparkDraftModel,
    target,
    examples: Sequence[Example],
    *,
    max_anchors: int = 64,
    num_drafts: int | None = None,
    seed: int = 0,
    on_example: Callable[[], None] | None = None,
) -> dict:
    """Over all sampled blocks: ``1 + Σ_k Π_{i<=k} [draft_i == target argmax_i]``, teacher forced.

    Returns ``sim_accept_len``; ``per_position_acceptance`` (the fraction of blocks whose slot k
    survives, as `dspark bench` reports it); ``per_position_match`` (P(draft k == target argmax)
    given the true prefix); ``tv_per_position`` (mean total variation between the two
    distributions over the draft vocab); ``sequences`` and ``blocks`` counted. ``num_drafts``
    counts only the first slots of each block, as decoding with that draft length does (a
    DSpark block of 8 drafts 8 tokens; `dspark bench` reports n=7).

    EAGLE-3: its training-time-test forward unrolls each chain on its own hidden states with
    the true tokens, which are the drafted ones for as long as the chain is accepted."""
    return simulated_accept_len_many(
        [model], target, examples, max_anchors=max_anchors, num_drafts=num_drafts, seed=seed, on_example=on_example
    )[0]
