"""Draft-vocabulary pruning tables (DESIGN §4).

``d2t`` [V_d] int64 holds *offsets*: ``target_id = draft_id + d2t[draft_id]``.
``t2d`` [V] bool is True for the target ids kept in the draft vocab. Kept ids are
sorted ascending, so draft id ``j`` is the ``j``-th kept target id.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dspark.errors import CheckpointError


def mapping_from_kept_ids(kept_ids: torch.Tensor, target_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept target ids (any order, unique) -> (d2t offsets, t2d mask)."""
    kept = torch.unique(kept_ids.to(torch.long))  # sorted ascending
    if kept.numel() != kept_ids.numel():
        raise ValueError("kept target ids must be unique")
    if kept.numel() and (kept[0] < 0 or kept[-1] >= target_vocab_size):
        raise ValueError(f"kept target ids must lie in [0, {target_vocab_size})")
    d2t = kept - torch.arange(kept.numel(), dtype=torch.long)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[kept] = True
    return d2t, t2d


def mapping_from_counts(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``draft_vocab_size`` most frequent target ids (ties broken by lower id)."""
    if draft_vocab_size > counts.numel():
        raise ValueError(f"draft vocab {draft_vocab_size} exceeds target vocab {counts.numel()}")
    ids = torch.arange(counts.numel(), dtype=torch.long)
    # Stable sort on -count keeps ascending ids among equal counts.
    order = torch.sort(-counts.to(torch.float64), stable=True).indices
    return mapping_from_kept_ids(ids[order[:draft_vocab_size]], counts.numel())


def identity_mapping(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(vocab_size, dtype=torch.long), torch.ones(vocab_size, dtype=torch.bool)


def draft_to_target_ids(d2t: torch.Tensor) -> torch.Tensor:
    return torch.arange(d2t.numel(), device=d2t.device, dtype=torch.long) + d2t


def target_to_draft_ids(t2d: torch.Tensor) -> torch.Tensor:
    """[V] int64: the draft id of each kept target id, -1 for pruned ids."""
    out = torch.full(t2d.shape, -1, dtype=torch.long, device=t2d.device)
    kept = torch.nonzero(t2d, as_tuple=True)[0]
    out[kept] = torch.arange(kept.numel(), device=t2d.device)
    return out


def validate_vocab_mapping(
    d2t: torch.Tensor, t2d: torch.Tensor, draft_vocab_size: int, target_vocab_size: int, *, source: str = "drafter"
) -> None:
    """Raise `CheckpointError` unless d2t/t2d are well-formed and consistent with each other."""
    if tuple(d2t.shape) != (draft_vocab_size,):
        raise CheckpointError(f"{source}: d2t has shape {tuple(d2t.shape)}, expected ({draft_vocab_size},)")
    if tuple(t2d.shape) != (target_vocab_size,):
        raise CheckpointError(f"{source}: t2d has shape {tuple(t2d.shape)}, expected ({target_vocab_size},)")
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise CheckpointError(f"{source}: d2t must be an integer tensor of offsets, got {d2t.dtype}")
    target_ids = draft_to_target_ids(d2t.to(torch.long).cpu())
    if draft_vocab_size and (target_ids.min() < 0 or target_ids.max() >= target_vocab_size):
        raise CheckpointError(
            f"{source}: d2t offsets point outside the target vocab [0, {target_vocab_size}) "
            "(absolute ids stored where offsets are expected?)"
        )
    if draft_vocab_size > 1 and not bool((target_ids[1:] > target_ids[:-1]).all()):
        raise CheckpointError(f"{source}: d2t does not map draft ids to strictly ascending target ids")
    t2d_cpu = t2d.to(torch.bool).cpu()
    if int(t2d_cpu.sum()) != draft_vocab_size or not bool(t2d_cpu[target_ids].all()):
        raise CheckpointError(f"{source}: t2d and d2t disagree on which target ids are kept")


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast computes in on ``device_type`` right now; None when it is off."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError, RuntimeError):  # older torch: no per-device queries
        pass
    return None


class TargetTiedVocab:
    """The pruned-vocab pieces every drafter shares (DSpark, DFlash, EAGLE-3).

    The host module defines ``config`` (draft/target vocab sizes, hidden size), the
    buffers ``d2t``/``t2d`` and the frozen target copies ``embed_tokens`` and ``lm_head``.
    """

    @property
    def draft_to_target(self) -> torch.Tensor:
        """Absolute target id of every draft id, [V_d] int64."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_vocab_mapping(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        validate_vocab_mapping(d2t, t2d, self.config.draft_vocab_size, self.config.target_vocab_size)
        self.d2t.copy_(d2t.to(torch.long))
        self.t2d.copy_(t2d.to(torch.bool))

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Backbone hidden [..., H] -> draft-vocab logits U [..., V_d] in fp32.

        The rows go in as one [rows, H] matrix: `F.linear` of a non-contiguous 3-D input
        (a batch's draft slots, a slice of the block) broadcasts the [V_d, H] weight to
        every batch entry and copies it there (16 sequences: ~160 ms a drafting step on
        2 cores, against ~5 ms as one product)."""
        lead = hidden.shape[:-1]
        hidden = hidden.reshape(-1, hidden.shape[-1])
        weight = self.lm_head.weight
        dtype = _autocast_dtype(weight.device.type)
        if dtype is None or weight.dtype == dtype or weight.requires_grad:
            return self.lm_head(hidden).float().view(*lead, -1)
        # Autocast casts a frozen weight again at every call (it caches only the casts of
        # weights that train): keep one cast copy until the weight changes. Same numbers.
        key = (weight.data_ptr(), weight._version, dtype)
        cached = getattr(self, "_lm_head_cast", None)
        if cached is None or cached[0] != key:
            cached = (key, weight.detach().to(dtype))
            object.__setattr__(self, "_lm_head_cast", cached)
        return F.linear(hidden, cached[1]).float().view(*lead, -1)

    @torch.no_grad()
    def copy_target_weights(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Copy the target's embedding [V, H] and its lm_head rows picked by t2d (ascending ids)."""
        cfg = self.config
        if tuple(embed_weight.shape) != (cfg.target_vocab_size, cfg.hidden_size):
            raise ValueError(
                f"target embedding has shape {tuple(embed_weight.shape)}, drafter expects "
                f"({cfg.target_vocab_size}, {cfg.hidden_size})"
            )
        if tuple(lm_head_weight.shape) != (cfg.target_vocab_size, cfg.hidden_size):
            raise ValueError(
                f"target lm_head has shape {tuple(lm_head_weight.shape)}, drafter expects "
                f"({cfg.target_vocab_size}, {cfg.hidden_size})"
            )
        self.embed_tokens.weight.copy_(embed_weight)
        self.lm_head.weight.copy_(lm_head_weight[self.draft_to_target.to(lm_head_weight.device)])
