"""d2t / t2d: offsets, round trips and validation."""

import pytest
import torch

from dspark.errors import CheckpointError
from dspark.model.vocab import (
    draft_to_target_ids,
    mapping_from_counts,
    mapping_from_kept_ids,
    target_to_draft_ids,
    validate_vocab_mapping,
)


def test_offsets_and_round_trip():
    kept = torch.tensor([7, 2, 9, 3])
    d2t, t2d = mapping_from_kept_ids(kept, 12)
    assert d2t.dtype == torch.long and t2d.dtype == torch.bool
    assert draft_to_target_ids(d2t).tolist() == [2, 3, 7, 9]  # ascending target ids
    assert d2t.tolist() == [2, 2, 5, 6]  # offsets, not absolute ids
    t2d_ids = target_to_draft_ids(t2d)
    assert t2d_ids[draft_to_target_ids(d2t)].tolist() == [0, 1, 2, 3]
    assert int((t2d_ids >= 0).sum()) == 4
    validate_vocab_mapping(d2t, t2d, 4, 12)


def test_counts_keep_most_frequent_with_ties_by_lower_id():
    counts = torch.tensor([5, 1, 5, 0, 9, 5])
    d2t, _ = mapping_from_counts(counts, 3)
    assert draft_to_target_ids(d2t).tolist() == [0, 2, 4]  # 9, then the two lowest ids with 5


@pytest.mark.parametrize(
    ("d2t", "t2d", "message"),
    [
        (torch.tensor([2, 3, 7, 9]), None, "outside the target vocab"),  # absolute ids, not offsets
        (torch.tensor([0, 0, 0]), None, "shape"),
        (torch.tensor([3, 2, 2, 2]), None, "ascending"),
        (torch.tensor([2.0, 2.0, 5.0, 6.0]), None, "integer"),
        (torch.tensor([2, 2, 5, 6]), torch.ones(12, dtype=torch.bool), "disagree"),
    ],
)
def test_damaged_mapping_is_named(d2t, t2d, message):
    if t2d is None:
        _, t2d = mapping_from_kept_ids(torch.tensor([2, 3, 7, 9]), 12)
    with pytest.raises(CheckpointError, match=message):
        validate_vocab_mapping(d2t, t2d, 4, 12)


def test_frozen_head_cast_once_under_autocast_gives_the_same_logits(tiny_targets):
    """base_logits keeps one bf16 copy of the frozen lm_head under autocast: the logits equal
    autocast's own cast, and a changed weight (a loaded checkpoint) is cast again."""
    from helpers import untrained_drafter

    model = untrained_drafter(tiny_targets["qwen3"])
    hidden = torch.randn(5, model.config.hidden_size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first, plain = model.base_logits(hidden), model.lm_head(hidden).float()
        again = model.base_logits(hidden)
    assert first.dtype == torch.float32
    assert torch.equal(first, plain) and torch.equal(again, plain)
    with torch.no_grad():
        model.lm_head.weight.mul_(-2.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        changed, plain = model.base_logits(hidden), model.lm_head(hidden).float()
    assert torch.equal(changed, plain) and not torch.equal(changed, first)
    assert torch.equal(model.base_logits(hidden), model.lm_head(hidden).float())  # autocast off: fp32
