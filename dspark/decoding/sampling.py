"""Turning logits into the distribution a token is drawn from (temperature, top-k, top-p)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy; top_k 0 and top_p 1.0 disable the filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] fp32 probabilities after temperature, top-k and top-p."""
    if params.greedy:
        raise ValueError("probabilities() is for sampling; greedy decoding uses argmax")
    scores = logits.float() / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        drop_sorted = ~nucleus(torch.softmax(sorted_scores, dim=-1), params.top_p)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.softmax(scores, dim=-1)


def nucleus(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which of the probabilities (sorted largest first, last dim) stay in the top-p nucleus:
    a token is dropped when the mass before it already reaches ``top_p``, so the top one stays."""
    return (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) < top_p


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a [V] distribution."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


CANDIDATES = 1024  # the tokens `sample_rows` filters first; a nucleus past them falls back


def candidates(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`probabilities` over each row's top candidates: ``(probs [n, c], ids [n, c], fits
    [n])`` where ``probs[i]`` over the token ids ``ids[i]`` is row i's filtered distribution
    when ``fits[i]``: a top-k of at most `CANDIDATES` tokens holds the whole filtered set, and
    so does a top-p nucleus whose mass the candidates reach (the rest of the row enters the
    normaliser only). A row that does not fit needs the whole vocabulary (`probabilities`)."""
    if params.greedy:
        raise ValueError("candidates() is for sampling; greedy decoding uses argmax")
    scores = logits.float() / params.temperature
    vocab = scores.shape[-1]
    limit = params.top_k if params.top_k and params.top_k < vocab else vocab
    c = min(limit, CANDIDATES)
    # One more than the candidates: a tie across the edge of a top-k is kept whole by
    # `probabilities`, so such a row does not fit.
    values, ids = torch.topk(scores, min(c + 1, vocab), dim=-1)  # sorted, largest first
    edge_tied = values[:, c] == values[:, c - 1] if c < vocab else torch.zeros_like(values[:, 0], dtype=torch.bool)
    values, ids = values[:, :c], ids[:, :c]
    # The normaliser: over the top-k's values (the whole row without a top-k).
    if c == limit:
        kept = values
    elif limit == vocab:
        kept = scores
    else:
        kept = torch.topk(scores, limit, dim=-1).values
    norm = torch.logsumexp(kept, dim=-1, keepdim=True)
    probs = torch.exp(values - norm)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if params.top_p < 1.0:
        keep = nucleus(probs, params.top_p)
    # A whole top-k fits unless tied at its edge; fewer candidates hold the filtered set only
    # if their mass reaches top_p.
    fits = ~edge_tied if c == limit else probs.sum(dim=-1) >= params.top_p
    return torch.softmax(values.masked_fill(~keep, float("-inf")), dim=-1), ids, fits


def sample_rows(logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator | None]) -> list[int]:
    """One draw per row of ``logits`` [n, V], row i with ``generators[i]``, from the
    distribution `probabilities` gives, over the rows' `candidates` where they hold it: many
    rows at a time this avoids sorting the vocabulary for every row (a datagen step)."""
    probs, ids, fits = candidates(logits, params)
    out = []
    for i in range(logits.shape[0]):
        if fits[i]:
            out.append(int(ids[i, torch.multinomial(probs[i], 1, generator=generators[i])]))
        else:
            full = probabilities(logits[i : i + 1], params)[0]
            out.append(int(torch.multinomial(full, 1, generator=generators[i])))
    return out
