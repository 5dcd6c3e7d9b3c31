"""Verification of a draft against the target: the lossless core of speculative decoding.

Both functions are pure: they take the draft and the target's scores for the verified
positions and return how many drafts survive plus the tokens to emit.

References: Leviathan, Kalman & Matias, "Fast Inference from Transformers via
Speculative Decoding" (ICML 2023); Chen et al., "Accelerating Large Language Model
Decoding with Speculative Sampling" (2023).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# The row-wise verifiers ask for the target's first two positions (anchor, first draft) at
# once and the rest only when both drafts were accepted: at the acceptance rates we see
# (first draft ~0.45, second ~0.45 after it) that skips most of an 8-row output projection,
# the largest single matrix of a small target (49152 x 576 for SmolLM2).
FIRST_ROWS = 2


@dataclass(frozen=True)
class Verdict:
    """``tokens`` = the accepted drafts followed by one target token (correction or bonus)."""

    num_accepted: int
    tokens: list[int]


def _check_draft(draft_tokens: torch.Tensor, rows: torch.Tensor, what: str) -> int:
    if draft_tokens.dim() != 1:
        raise ValueError(f"draft_tokens must be 1-D [K], got shape {tuple(draft_tokens.shape)}")
    k = draft_tokens.shape[0]
    if rows.dim() != 2 or rows.shape[0] != k + 1:
        raise ValueError(f"{what} must be [K+1, V] = [{k + 1}, V], got {tuple(rows.shape)}")
    if k and (int(draft_tokens.min()) < 0 or int(draft_tokens.max()) >= rows.shape[1]):
        raise ValueError(f"draft token ids must lie in [0, {rows.shape[1]})")
    return k


def verify_greedy(
    draft_tokens: torch.Tensor,  # [K] target ids
    target_logits: torch.Tensor,  # [K+1, V]; row i scores the token after draft i-1 (row 0: after the anchor)
) -> Verdict:
    """Accept the longest prefix where draft == target argmax; then emit the target's token."""
    k = _check_draft(draft_tokens, target_logits, "target_logits")
    return verify_greedy_rows(draft_tokens, lambda a, b: target_logits[a:b], first=k + 1)


def verify_greedy_rows(
    draft_tokens: torch.Tensor,  # [K] target ids
    score_rows: Callable[[int, int], torch.Tensor],  # (start, stop) -> target logits rows [stop-start, V]
    *,
    first: int = FIRST_ROWS,
) -> Verdict:
    """`verify_greedy`, asking for the target's logits rows only as far as they are needed:
    rows ``[0, first)`` first, the rest only if every draft they score was accepted. A draft
    rejected early then costs no output projection for the positions after it."""
    if draft_tokens.dim() != 1:
        raise ValueError(f"draft_tokens must be 1-D [K], got shape {tuple(draft_tokens.shape)}")
    if first < 1:
        raise ValueError(f"first must be >= 1, got {first}")
    drafts = draft_tokens.cpu().tolist()
    k = len(drafts)
    choice: list[int] = []
    start, stop = 0, min(k + 1, first)
    while True:
        rows = score_rows(start, stop)
        if rows.dim() != 2 or rows.shape[0] != stop - start:
            raise ValueError(f"score_rows({start}, {stop}) must return [{stop - start}, V], got {tuple(rows.shape)}")
        if start == 0 and k and not (min(drafts) >= 0 and max(drafts) < rows.shape[1]):
            raise ValueError(f"draft token ids must lie in [0, {rows.shape[1]})")
        choice.extend(rows.argmax(dim=-1).cpu().tolist())
        for i in range(start, min(stop, k)):
            if drafts[i] != choice[i]:
                return Verdict(i, [*drafts[:i], choice[i]])
        if stop == k + 1:
            return Verdict(k, [*drafts, choice[k]])
        start, stop = stop, k + 1


def verify_sampling(
    draft_tokens: torch.Tensor,  # [K] target ids, drawn from draft_probs
    draft_probs: torch.Tensor,  # [K, V] the exact distributions the drafts were drawn from
    target_probs: torch.Tensor,  # [K+1, V] the target's (processed) distributions
    generator: torch.Generator | None,
) -> Verdict:
    """Rejection sampling: accept draft x with prob min(1, p(x)/q(x)); on rejection draw
    from norm(max(p - q, 0)); after K accepts draw the bonus token from p_K.
    The emitted tokens follow the target distribution exactly."""
    k = _check_draft(draft_tokens, target_probs, "target_probs")
    if tuple(draft_probs.shape) != (k, target_probs.shape[1]):
        raise ValueError(f"draft_probs must be [K, V] = [{k}, {target_probs.shape[1]}], got {tuple(draft_probs.shape)}")
    return verify_sampling_rows(
        draft_tokens, draft_probs.to(target_probs.device), lambda a, b: target_probs[a:b], generator, first=k + 1
    )


def verify_sampling_rows(
    draft_tokens: torch.Tensor,  # [K] target ids, drawn from draft_probs
    draft_probs: torch.Tensor,  # [K, V] the exact distributions the drafts were drawn from
    target_prob_rows: Callable[[int, int], torch.Tensor],  # (start, stop) -> target distributions [stop-start, V]
    generator: torch.Generator | None,
    *,
    first: int = FIRST_ROWS,
) -> Verdict:
    """`verify_sampling`, asking for the target's distributions only as far as they are needed
    (rows ``[0, first)`` first, the rest only if every draft they judge was accepted). The
    random draws are the same as `verify_sampling`'s: K uniforms up front, then one multinomial."""
    if draft_tokens.dim() != 1:
        raise ValueError(f"draft_tokens must be 1-D [K], got shape {tuple(draft_tokens.shape)}")
    if first < 1:
        raise ValueError(f"first must be >= 1, got {first}")
    k = draft_tokens.shape[0]
    if draft_probs.dim() != 2 or draft_probs.shape[0] != k:
        raise ValueError(f"draft_probs must be [K, V] with K = {k}, got {tuple(draft_probs.shape)}")
    device = draft_probs.device
    drafts = draft_tokens.to(device)
    if k and not (int(drafts.min()) >= 0 and int(drafts.max()) < draft_probs.shape[1]):
        raise ValueError(f"draft token ids must lie in [0, {draft_probs.shape[1]})")
    q_x = draft_probs[torch.arange(k, device=device), drafts].float()
    if k and bool((q_x <= 0).any()):
        raise ValueError("a draft token has zero draft probability: draft_probs is not its distribution")
    uniforms = torch.rand(k, generator=generator, device=device)
    start, stop = 0, min(k + 1, first)
    rows: list[torch.Tensor] = []
    while True:
        chunk = target_prob_rows(start, stop)
        if chunk.dim() != 2 or chunk.shape[0] != stop - start or chunk.shape[1] != draft_probs.shape[1]:
            raise ValueError(
                f"target rows ({start}, {stop}) must be [{stop - start}, {draft_probs.shape[1]}], "
                f"got {tuple(chunk.shape)}"
            )
        chunk = chunk.to(device).float()
        rows.extend(chunk)
        judged = torch.arange(start, min(stop, k), device=device)
        p_x = chunk[torch.arange(judged.numel(), device=device), drafts[judged]]
        rejected = (~(uniforms[judged] < p_x / q_x[judged])).nonzero()  # min(1, .) is implicit: uniforms < 1
        if rejected.numel():
            accepted = start + int(rejected[0, 0])
            break
        if stop == k + 1:
            accepted = k
            break
        start, stop = stop, k + 1
    if accepted < k:
        residual = torch.clamp(rows[accepted] - draft_probs[accepted].float(), min=0.0)
        total = residual.sum()
        # p == q (up to rounding) leaves no residual mass; then p itself is the right law.
        dist = residual / total if total > 0 else rows[accepted]
    else:
        dist = rows[k]
    last = int(torch.multinomial(dist, 1, generator=generator).item())
    return Verdict(accepted, [*drafts[:accepted].tolist(), last])
