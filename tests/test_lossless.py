"""Speculative greedy == target greedy, token for token, for every drafter and target."""

import pytest
from helpers import ModelDrafter, untrained_drafter

from dspark.decoding import DSparkDrafter, NgramDrafter, SamplingParams, SpeculativeEngine

PROMPT = "def add(a, b):\n    return"
MAX_NEW = 40


def encode(target, text=PROMPT):
    return target.tokenizer(text)["input_ids"]


@pytest.fixture(scope="module")
def plain_outputs(tiny_targets):
    return {
        arch: SpeculativeEngine(t).generate(encode(t), max_new_tokens=MAX_NEW, stop_token_ids=set()).tokens
        for arch, t in tiny_targets.items()
    }


@pytest.mark.parametrize("arch", ["llama", "qwen3", "deepseek_v3"])
@pytest.mark.parametrize("sample_from_anchor", [True, False])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_untrained_dspark_is_lossless(tiny_targets, plain_outputs, arch, sample_from_anchor, k):
    target = tiny_targets[arch]
    model = untrained_drafter(target, sample_from_anchor=sample_from_anchor)
    drafter = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    result = SpeculativeEngine(target, drafter, num_speculative_tokens=k).generate(
        encode(target), max_new_tokens=MAX_NEW, stop_token_ids=set()
    )
    assert result.tokens == plain_outputs[arch]
    assert result.accept_len >= 1.0
    assert len(result.per_position_acceptance) == k
    assert result.lookup_steps is None  # no prompt lookup here


@pytest.mark.parametrize("arch", ["llama", "qwen3", "deepseek_v3"])
@pytest.mark.parametrize("k", [1, 7])
def test_untrained_eagle3_is_lossless(tiny_targets, plain_outputs, arch, k):
    from dspark.decoding import Eagle3Drafter
    from dspark.formats.checkpoint import init_drafter
    from dspark.model.eagle3 import Eagle3Config
    from dspark.model.pairing import config_for_target

    target = tiny_targets[arch]
    config = Eagle3Config.like(config_for_target(target), speculative_steps=7)
    model = init_drafter(target, config)
    drafter = Eagle3Drafter(model, target_vocab_size=target.vocab_size)
    result = SpeculativeEngine(target, drafter, num_speculative_tokens=k).generate(
        encode(target), max_new_tokens=MAX_NEW, stop_token_ids=set()
    )
    assert result.tokens == plain_outputs[arch]
    assert len(result.per_position_acceptance) == k


@pytest.mark.parametrize("arch", ["llama", "qwen3", "deepseek_v3"])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_ngram_is_lossless(tiny_targets, plain_outputs, arch, k):
    target = tiny_targets[arch]
    result = SpeculativeEngine(target, NgramDrafter(target.vocab_size), num_speculative_tokens=k).generate(
        encode(target), max_new_tokens=MAX_NEW, stop_token_ids=set()
    )
    assert result.tokens == plain_outputs[arch]


@pytest.mark.parametrize("k", [1, 3, 7])
def test_oracle_drafter_accepts_everything(tiny_targets, plain_outputs, k):
    """A drafter that proposes the target's own greedy tokens exercises the all-accept path."""
    target = tiny_targets["qwen3"]
    result = SpeculativeEngine(target, ModelDrafter(target), num_speculative_tokens=k).generate(
        encode(target), max_new_tokens=MAX_NEW, stop_token_ids=set()
    )
    assert result.tokens == plain_outputs["qwen3"]
    assert all(a == 1.0 for a in result.per_position_acceptance)
    # Every step but possibly the last (shortened to the token budget) emits k + 1 tokens.
    assert result.target_forwards == -(-(MAX_NEW - 1) // (k + 1))
    assert result.accept_len == pytest.approx((MAX_NEW - 1) / result.target_forwards)


def test_plain_decoding_accept_len_is_one(tiny_targets):
    target = tiny_targets["llama"]
    result = SpeculativeEngine(target).generate(encode(target), max_new_tokens=20, stop_token_ids=set())
    assert result.accept_len == 1.0
    assert result.target_forwards == 19
    assert len(result.tokens) == 20


def test_generation_stops_at_a_stop_token_inside_accepted_drafts(tiny_targets, plain_outputs):
    target = tiny_targets["qwen3"]
    plain = plain_outputs["qwen3"]
    stop = plain[10]
    first = plain.index(stop)
    result = SpeculativeEngine(target, ModelDrafter(target), num_speculative_tokens=7).generate(
        encode(target), max_new_tokens=MAX_NEW, stop_token_ids={stop}
    )
    assert result.tokens == plain[: first + 1]


def test_markov_variants_and_dflash_are_lossless(tiny_targets, plain_outputs):
    target = tiny_targets["llama"]
    for kwargs in (
        dict(markov_head_type="gated"),
        dict(markov_head_type="rnn"),
        dict(markov_rank=0, enable_confidence_head=False, confidence_head_with_markov=False),
        dict(confidence_head_with_markov=False),
    ):
        model = untrained_drafter(target, **kwargs)
        result = SpeculativeEngine(
            target, DSparkDrafter(model, target_vocab_size=target.vocab_size), num_speculative_tokens=5
        ).generate(encode(target), max_new_tokens=24, stop_token_ids=set())
        assert result.tokens == plain_outputs["llama"][:24], kwargs


def test_confidence_threshold_only_shortens_drafts(tiny_targets, plain_outputs):
    target = tiny_targets["qwen3"]
    model = untrained_drafter(target)
    full = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    cut = DSparkDrafter(model, target_vocab_size=target.vocab_size, confidence_threshold=0.2)
    params = SamplingParams()
    r_full = SpeculativeEngine(target, full, num_speculative_tokens=7).generate(
        encode(target), max_new_tokens=MAX_NEW, stop_token_ids=set(), params=params
    )
    r_cut = SpeculativeEngine(target, cut, num_speculative_tokens=7).generate(
        encode(target), max_new_tokens=MAX_NEW, stop_token_ids=set(), params=params
    )
    assert r_cut.tokens == r_full.tokens == plain_outputs["qwen3"]
    # sigmoid of an untrained head is near 0.5, so the survival product drops below 0.2 by slot 3.
    # Without a threshold every step drafts min(7, budget left - 1): sum over the 39 steps = 245.
    assert r_full.drafted_tokens == 245
    assert r_cut.drafted_tokens <= 3 * r_cut.target_forwards


def test_confidence_threshold_needs_a_confidence_head(tiny_targets):
    target = tiny_targets["llama"]
    model = untrained_drafter(target, markov_rank=0, enable_confidence_head=False, confidence_head_with_markov=False)
    with pytest.raises(ValueError, match="confidence head"):
        DSparkDrafter(model, target_vocab_size=target.vocab_size, confidence_threshold=0.5)


def test_k_larger_than_the_block_is_refused(tiny_targets):
    target = tiny_targets["llama"]
    model = untrained_drafter(target, block_size=4, sample_from_anchor=False)
    drafter = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    assert drafter.max_draft_tokens == 3
    with pytest.raises(ValueError, match="exceeds"):
        SpeculativeEngine(target, drafter, num_speculative_tokens=4)


REPEATING = "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,"


@pytest.mark.parametrize("k", [1, 3, 7])
def test_lookup_first_dspark_is_lossless_and_uses_both_drafters(tiny_targets, k):
    """Prompt lookup first, the model's block otherwise: token-identical to plain decoding,
    and on a repeating prompt both branches draft."""
    from dspark.decoding import LookupFirstDrafter

    target = tiny_targets["llama"]
    ids = encode(target, REPEATING)
    plain = SpeculativeEngine(target).generate(ids, max_new_tokens=MAX_NEW, stop_token_ids=set()).tokens
    drafter = LookupFirstDrafter(
        DSparkDrafter(untrained_drafter(target), target_vocab_size=target.vocab_size), target.vocab_size, min_ngram=2
    )
    assert drafter.name == "dspark+ngram"
    result = SpeculativeEngine(target, drafter, num_speculative_tokens=k).generate(
        ids, max_new_tokens=MAX_NEW, stop_token_ids=set()
    )
    assert result.tokens == plain
    assert drafter.lookup_steps > 0 and drafter.model_steps > 0
    assert result.lookup_steps == drafter.lookup_steps  # one generation: the result's own count
    assert drafter.lookup_steps + drafter.model_steps <= result.target_forwards
    assert drafter.timings["lookup"] > 0 and drafter.timings["backbone"] > 0
