"""Drafters and helpers for tests only."""

from __future__ import annotations

import torch

from dspark.decoding.drafters import point_mass
from dspark.decoding.proposal import Proposal
from dspark.decoding.sampling import SamplingParams, probabilities
from dspark.formats.checkpoint import init_drafter
from dspark.model.pairing import config_for_target
from dspark.model.vocab import mapping_from_kept_ids
from dspark.target import TargetModel


class ModelDrafter:
    """Drafts with a copy of the target itself (no cache): an oracle at ``temperature_scale=1``.

    With ``temperature_scale != 1`` its distribution differs from the target's, so rejection
    sampling accepts some drafts and rejects others.
    """

    aux_layer_ids = ()

    def __init__(self, target: TargetModel, *, temperature_scale: float = 1.0, max_draft: int = 8) -> None:
        self.model = target.model
        self.vocab_size = target.vocab_size
        self.scale = temperature_scale
        self._max = max_draft
        self.name = "model"
        self.history: list[int] = []

    @property
    def max_draft_tokens(self) -> int:
        return self._max

    def begin(self, prompt_ids, prompt_aux) -> None:
        self.history = prompt_ids.tolist()

    def accept(self, token_ids, aux) -> None:
        self.history.extend(token_ids.tolist())

    @torch.inference_mode()
    def propose(self, anchor, k, params: SamplingParams, generator) -> Proposal:
        seq = [*self.history, anchor]
        tokens, rows = [], []
        for _ in range(k):
            logits = self.model(input_ids=torch.tensor([seq])).logits[0, -1].float()
            if params.greedy:
                tok = int(logits.argmax())
            else:
                draft_params = SamplingParams(params.temperature * self.scale, params.top_k, params.top_p)
                q = probabilities(logits, draft_params)
                tok = int(torch.multinomial(q, 1, generator=generator))
                rows.append(q)
            tokens.append(tok)
            seq.append(tok)
        out = torch.tensor(tokens, dtype=torch.long)
        probs = None if params.greedy else (torch.stack(rows) if rows else point_mass(out, self.vocab_size))
        return Proposal(tokens=out, probs=probs)


def untrained_drafter(target: TargetModel, **kwargs):
    config = config_for_target(target, **kwargs)
    vocab = None
    if config.uses_pruned_vocab:  # keep the first draft_vocab_size target ids
        vocab = mapping_from_kept_ids(torch.arange(config.draft_vocab_size), target.vocab_size)
    model = init_drafter(target, config, vocab=vocab)
    return model
