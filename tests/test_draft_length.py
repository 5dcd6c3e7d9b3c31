"""Cost-model draft length: the stopping rule, its cost file, its measurement, losslessness."""

import json

import pytest
import torch
from helpers import untrained_drafter

from dspark.decoding import DSparkDrafter, SamplingParams, SpeculativeEngine, StepCost, measure_step_cost
from dspark.decoding.step_timing import monotone_costs
from dspark.errors import DSparkError

PROMPT = "def add(a, b):\n    return"
MAX_NEW = 40
# A CPU-like cost, exaggerated: one token is cheap, two or more cost 3x as much, then nearly flat.
KINK = StepCost(verify_seconds=(1.0, 3.0, 3.05, 3.1, 3.15, 3.2, 3.25, 3.3), draft_seconds=0.0)
FLAT = StepCost(verify_seconds=(1.0,) * 8, draft_seconds=0.1)


def test_rule_drafts_everything_when_verification_is_free():
    assert all(FLAT.include(1.0, 0.01, 0.01, j, 7) for j in range(7))
    assert not FLAT.include(1.0, 0.5, 0.5, 7, 7)  # never past k


def test_rule_looks_past_the_one_token_kink():
    # c = 0.95: one draft alone loses ((1 + 0.95) / 3 < 1), seven win; the rule drafts.
    assert KINK.include(1.0, 0.95, 0.95, 0, 7)
    # c = 0.3: no length beats plain decoding; the rule stops before the first draft.
    assert not KINK.include(1.0, 0.3, 0.3, 0, 7)
    # mid-block, with the expensive first draft paid for, a weak slot is still worth its 0.05.
    assert KINK.include(2.5, 0.2, 0.3, 2, 7)


def test_expected_best_agrees_with_the_sequential_rule_for_constant_confidence():
    for c in (0.2, 0.5, 0.7, 0.9, 0.99):
        best, _ = KINK.expected_best([c] * 7, 7)
        expected, survival, n = 1.0, 1.0, 0
        while n < 7 and KINK.include(expected, survival * c, c, n, 7):
            survival *= c
            expected += survival
            n += 1
        assert n == best, c


def test_measured_costs_are_made_non_decreasing():
    # a slow spell at 4 tokens (0.264) must not make 5+ tokens look cheaper than 4
    measured = [0.0745, 0.1214, 0.149, 0.2644, 0.1285, 0.1396, 0.1554, 0.1514, 0.1258]
    assert monotone_costs(measured) == [0.0745, 0.1214, 0.1258, 0.1258, 0.1258, 0.1258, 0.1258, 0.1258, 0.1258]
    assert monotone_costs([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]


def test_step_cost_file_round_trip_and_errors(tmp_path):
    path = tmp_path / "cost.json"
    KINK.save(path)
    assert StepCost.load(path) == KINK
    with pytest.raises(DSparkError, match="not found"):
        StepCost.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DSparkError, match="not JSON"):
        StepCost.load(tmp_path / "bad.json")
    (tmp_path / "keys.json").write_text(json.dumps({"verify": [1.0]}))
    with pytest.raises(DSparkError, match="verify_seconds"):
        StepCost.load(tmp_path / "keys.json")
    with pytest.raises(DSparkError, match="positive"):
        StepCost((1.0, 0.0), 0.1)


def test_measured_cost_leaves_target_and_drafter_usable(tiny_targets):
    target = tiny_targets["llama"]
    drafter = DSparkDrafter(untrained_drafter(target), target_vocab_size=target.vocab_size)
    cost = measure_step_cost(target, drafter, repeats=2)
    assert len(cost.verify_seconds) == drafter.max_draft_tokens + 1
    assert all(t > 0 for t in cost.verify_seconds) and cost.draft_seconds > 0
    assert list(cost.verify_seconds) == sorted(cost.verify_seconds)
    assert target.cache_len == 0
    ids = target.tokenizer(PROMPT)["input_ids"]
    plain = SpeculativeEngine(target).generate(ids, max_new_tokens=20, stop_token_ids=set())
    drafter.step_cost = cost
    spec = SpeculativeEngine(target, drafter, num_speculative_tokens=7).generate(
        ids, max_new_tokens=20, stop_token_ids=set()
    )
    assert spec.tokens == plain.tokens


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_cost_model_only_changes_draft_lengths(tiny_targets, arch):
    target = tiny_targets[arch]
    model = untrained_drafter(target)
    with torch.no_grad():  # every slot's confidence exactly 0.5
        model.confidence_head.proj.weight.zero_()
        model.confidence_head.proj.bias.zero_()
    ids = target.tokenizer(PROMPT)["input_ids"]
    plain = SpeculativeEngine(target).generate(ids, max_new_tokens=MAX_NEW, stop_token_ids=set())
    drafted = {}
    for name, cost in (("kink", KINK), ("flat", FLAT)):
        drafter = DSparkDrafter(model, target_vocab_size=target.vocab_size, step_cost=cost)
        result = SpeculativeEngine(target, drafter, num_speculative_tokens=7).generate(
            ids, max_new_tokens=MAX_NEW, stop_token_ids=set()
        )
        assert result.tokens == plain.tokens, name
        drafted[name] = result.drafted_tokens
    # c = 0.5 everywhere: across the kink that never pays (E(7) = 1.99 < 3.3), so no drafts at all;
    # with free verification every step drafts min(7, budget left - 1) (39 steps: 245).
    assert drafted == {"kink": 0, "flat": 245}


def test_cost_model_sampling_runs_and_stays_in_vocab(tiny_targets):
    target = tiny_targets["qwen3"]
    drafter = DSparkDrafter(untrained_drafter(target), target_vocab_size=target.vocab_size, step_cost=FLAT)
    g = torch.Generator().manual_seed(0)
    result = SpeculativeEngine(target, drafter, num_speculative_tokens=5).generate(
        target.tokenizer(PROMPT)["input_ids"],
        max_new_tokens=24,
        params=SamplingParams(temperature=0.8),
        generator=g,
        stop_token_ids=set(),
    )
    assert len(result.tokens) == 24 and all(0 <= t < target.vocab_size for t in result.tokens)


def test_cost_model_needs_a_confidence_head_and_excludes_a_threshold(tiny_targets):
    target = tiny_targets["llama"]
    bare = untrained_drafter(target, markov_rank=0, enable_confidence_head=False, confidence_head_with_markov=False)
    with pytest.raises(ValueError, match="confidence head"):
        DSparkDrafter(bare, target_vocab_size=target.vocab_size, step_cost=FLAT)
    with pytest.raises(ValueError, match="one draft-length rule"):
        DSparkDrafter(
            untrained_drafter(target), target_vocab_size=target.vocab_size, confidence_threshold=0.5, step_cost=FLAT
        )
