"""Batched speculative decoding: every sequence of a batch decodes as it would alone.

Greedy: sequences of mixed prompt lengths, lengths, stop points and draft lengths (zero
included), more of them than slots (so sequences join as others leave and slots move), give
token for token what the one-sequence engine gives for each. Sampling: a sequence sampled
inside a batch follows the target's joint distribution (same test as the one-sequence
engine's, tests/test_sampling_engine.py).
"""

import pytest
import torch
from helpers import ModelDrafter, untrained_drafter
from test_sampling_engine import PARAMS, exact_joint

from dspark.decoding import DSparkDrafter, SpeculativeEngine
from dspark.decoding.batch import BatchedEngine, Sequence
from dspark.decoding.drafters import fork_drafter
from dspark.errors import DSparkError
from dspark.target.slots import SlotDecoder

PROMPTS = ["def add(a, b):", "the answer is", "for i in range(10):", "print", "sold clips to friends in April"]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_batch_equals_each_sequence_alone(tiny_targets, arch):
    target = tiny_targets[arch]
    torch.manual_seed(0)
    model = untrained_drafter(target)
    aux = tuple(model.config.aux_hidden_state_layer_ids)
    tok = target.tokenizer
    specs = []  # (prompt ids, max_new_tokens, k, stop ids)
    for i, text in enumerate(PROMPTS * 2):
        ids = tok(text)["input_ids"]
        specs.append((ids, 6 + 4 * i, [0, 1, 3, 5][i % 4], set()))
    # A stop token the plain decoding of the first prompt reaches: that sequence stops early.
    alone = SpeculativeEngine(target).generate(specs[0][0], max_new_tokens=specs[0][1], stop_token_ids=set())
    stop = alone.tokens[len(alone.tokens) // 2]
    cut = alone.tokens.index(stop)  # where it first appears
    specs[0] = (specs[0][0], specs[0][1], 3, {stop})

    decoder = SlotDecoder(target.model, slots=3, max_len=128)
    engine = BatchedEngine(decoder, capture=aux)
    base = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    seqs = [
        Sequence(
            prompt=ids,
            max_new_tokens=n,
            stop_ids=stops,
            drafter=fork_drafter(base) if k else None,
            num_speculative_tokens=k,
        )
        for ids, n, k, stops in specs
    ]
    engine.run(seqs)
    assert not engine.active
    for seq, (ids, n, k, stops) in zip(seqs, specs, strict=True):
        drafter = DSparkDrafter(model, target_vocab_size=target.vocab_size) if k else None
        ref = SpeculativeEngine(target, drafter, num_speculative_tokens=k).generate(
            ids, max_new_tokens=n, stop_token_ids=stops
        )
        assert seq.finished and seq.tokens == ref.tokens, (ids, k)
        if k:  # the same drafts accepted as alone: the drafter saw the same states
            assert seq.forwards == ref.target_forwards
    forked = fork_drafter(base)
    assert forked.model is base.model and forked is not base and forked.timings is not base.timings
    assert seqs[0].tokens[-1] in specs[0][3] and len(seqs[0].tokens) == cut + 1


def test_extend_matches_one_sequence_forwards(tiny_targets):
    """Rows of different lengths in one forward: each slot's logits and captured states equal
    the target's own forward over that sequence alone."""
    target = tiny_targets["qwen3"]
    decoder = SlotDecoder(target.model, slots=3, max_len=64)
    capture = (1, target.num_layers)
    seqs = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    news = [[20, 21, 22], [23], [24, 25]]
    for slot, ids in enumerate(seqs):
        decoder.prefill(slot, ids, capture)
    out = decoder.extend(news, capture)
    for (logits, aux), ids, new in zip(out, seqs, news, strict=True):
        target.reset()
        full = target.forward(torch.tensor(ids + new), capture=capture)
        torch.testing.assert_close(logits, full.logits[len(ids) :], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(aux.float(), full.aux_hidden[len(ids) :].float(), rtol=1e-4, atol=1e-4)
    # Taking back a slot's positions, then extending again, reads only what it kept.
    decoder.set_length(0, len(seqs[0]) + 1)
    (logits, _), _, _ = decoder.extend([[30, 31], [32], [33]], capture)
    target.reset()
    again = target.forward(torch.tensor(seqs[0] + news[0][:1] + [30, 31]))
    torch.testing.assert_close(logits, again.logits[-2:], rtol=1e-4, atol=1e-4)
    with pytest.raises(DSparkError, match="cannot set a length"):
        decoder.set_length(1, 999)


def test_a_cached_prefix_gives_what_a_full_prefill_gives(tiny_targets):
    """A prompt that starts with the cached prefix (the chat template's system turn): its
    logits, captured states and later steps equal a prefill of the whole prompt; a prompt
    that does not start with it is prefilled whole."""
    target = tiny_targets["qwen3"]
    capture = (1, target.num_layers)
    prefix, ids, other = [5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 9, 10, 11, 12, 13], [5, 6, 7, 4, 9, 10, 11]
    whole = SlotDecoder(target.model, slots=2, max_len=64)
    cached = SlotDecoder(target.model, slots=2, max_len=64)
    cached.set_prefix(prefix)
    for slot, prompt in enumerate((ids, other)):
        logits, aux = whole.prefill(slot, prompt, capture)
        got_logits, got_aux = cached.prefill(slot, prompt, capture)
        assert got_aux.shape == aux.shape == (len(prompt), 2 * target.hidden_size)
        torch.testing.assert_close(got_logits, logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got_aux, aux, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(cached.prefill(slot, prompt), logits, rtol=1e-4, atol=1e-4)  # no capture
    for (a, _), (b, _) in zip(whole.extend([[20, 21], [22]]), cached.extend([[20, 21], [22]]), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    with pytest.raises(DSparkError, match="does not fit"):
        cached.set_prefix(list(range(1, 70)))


def test_greedy_batch_over_a_cached_prefix_equals_each_sequence_alone(tiny_targets):
    """The batch server's set-up (the chat turn's prefix cached, DSpark drafting from the
    prefilled states): every sequence decodes as the one-sequence engine decodes it."""
    from dspark.target.slots import shared_prefix

    target = tiny_targets["llama"]
    torch.manual_seed(1)
    model = untrained_drafter(target)
    tok = target.tokenizer
    prompts = [tok("system: answer briefly.\nuser: " + t)["input_ids"] for t in PROMPTS]
    decoder = SlotDecoder(target.model, slots=2, max_len=128)
    decoder.set_prefix(shared_prefix(prompts))
    assert decoder._prefix and all(p[: len(decoder._prefix)] == decoder._prefix for p in prompts)
    engine = BatchedEngine(decoder, capture=tuple(model.config.aux_hidden_state_layer_ids))
    base = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    seqs = [
        Sequence(prompt=p, max_new_tokens=12, drafter=fork_drafter(base), num_speculative_tokens=3) for p in prompts
    ]
    engine.run(seqs)
    for seq, ids in zip(seqs, prompts, strict=True):
        drafter = DSparkDrafter(model, target_vocab_size=target.vocab_size)
        ref = SpeculativeEngine(target, drafter, num_speculative_tokens=3).generate(
            ids, max_new_tokens=12, stop_token_ids=set()
        )
        assert seq.tokens == ref.tokens and seq.forwards == ref.target_forwards


def test_sampling_in_a_batch_follows_the_target(tiny_targets):
    """Sixteen sequences sampled side by side, each with its own generator, drafts from a
    different distribution (accept and reject paths), TV < 0.06 over 3008 samples."""
    target = tiny_targets["qwen3"]
    prompt = target.tokenizer("for i in")["input_ids"]
    exact = exact_joint(target, prompt, 3)
    counts = dict.fromkeys(exact, 0)
    engine = BatchedEngine(SlotDecoder(target.model, slots=16, max_len=32))
    accepted = drafted = n = 0
    for batch in range(188):
        seqs = [
            Sequence(
                prompt=prompt,
                max_new_tokens=3,
                params=PARAMS,
                generator=torch.Generator().manual_seed(1000 * batch + i),
                drafter=ModelDrafter(target, temperature_scale=1.6),
                num_speculative_tokens=2,
            )
            for i in range(16)
        ]
        for seq in engine.run(seqs):
            counts[tuple(seq.tokens)] += 1
            accepted += seq.accepted
            drafted += seq.drafted
            n += 1
    tv = 0.5 * sum(abs(counts[key] / n - exact[key]) for key in exact)
    assert tv < 0.06, f"TV {tv:.3f}"
    assert 0 < accepted < drafted


def test_a_drafter_reading_uncaptured_layers_is_refused(tiny_targets):
    target = tiny_targets["qwen3"]
    model = untrained_drafter(target)
    engine = BatchedEngine(SlotDecoder(target.model, slots=2, max_len=32))  # captures nothing
    seq = Sequence(prompt=[5, 6], max_new_tokens=4, drafter=DSparkDrafter(model, target_vocab_size=target.vocab_size))
    with pytest.raises(DSparkError, match="reads layers"):
        engine.add(seq)


def test_load_aware_length_drafts_when_cheap_and_stops_under_load():
    from dspark.decoding.draft_length import BatchStepCost, LoadAwareDraftLength

    # One sequence: verifying 8 tokens costs what 1 does (weights read once). Sixteen: the
    # forward is compute-bound, every token costs its share.
    cost = BatchStepCost(
        batches=(1, 16), widths=tuple(range(1, 9)), seconds=((0.03,) * 8, tuple(0.1 * w for w in range(1, 9)))
    )
    rule = LoadAwareDraftLength(cost, 7)
    for _ in range(50):
        rule.observe(7, 4)  # the first four drafts usually accepted
    assert rule.pick(1) >= 4
    assert rule.pick(16) == 0
    assert cost.step_seconds(8, 1) == pytest.approx(0.03 + (0.1 - 0.03) * 7 / 15)


def test_load_aware_length_drafts_only_for_a_gain_beyond_its_margin():
    from dspark.decoding.draft_length import BatchStepCost, LoadAwareDraftLength

    # One draft costs 45% more; half of the drafts accepted: 1.5 tokens for 1.45 the time, a
    # 3.4% gain: inside the 5% margin, so plain steps; with no margin, one draft.
    cost = BatchStepCost(batches=(1, 16), widths=(1, 2), seconds=((0.03, 0.03), (0.1, 0.145)))
    for margin, k in ((0.05, 0), (0.0, 1)):
        rule = LoadAwareDraftLength(cost, 1, margin=margin)
        for _ in range(200):
            rule.observe(1, 0)
            rule.observe(1, 1)
        assert rule.pick(16) == k
        assert rule.pick(1) == 1  # alone the draft is free
    with pytest.raises(ValueError, match="margin"):
        LoadAwareDraftLength(cost, 1, margin=-0.1)


def test_load_aware_length_stops_a_choice_its_steps_show_dear():
    from dspark.decoding.draft_length import BatchStepCost, LoadAwareDraftLength

    # The start-up table says one draft costs 10% more than a plain step at 16 sequences;
    # with most drafts accepted the rule drafts. The server's steps then take twice the
    # table's figure when it drafts: after a few such steps it plain-steps, and a plain
    # step's own figure is left as measured.
    cost = BatchStepCost(batches=(1, 16), widths=(1, 2), seconds=((0.03, 0.03), (0.1, 0.11)))
    rule = LoadAwareDraftLength(cost, 1)
    for _ in range(100):
        rule.observe(1, 1)
    assert rule.pick(16) == 1
    rule.observe_step(12, 1, 0.2)  # a batch of 12 counts at the nearest measured size, 16
    ratio = (0.95 * 1.0 + 0.2 / cost.step_seconds(12, 2)) / (0.95 * 1.0 + 1.0)  # the prior: one step at 1.0
    assert rule.step_seconds(16, 1) == pytest.approx(0.11 * ratio)
    for _ in range(3):
        rule.observe_step(16, 1, 0.2)
    assert rule.pick(16) == 0
    assert rule.step_seconds(16, 0) == pytest.approx(0.1)
    for _ in range(5):
        rule.observe_step(16, 0, 0.1)
    assert rule.step_seconds(16, 0) == pytest.approx(0.1)  # measured as the table said
    rule.observe_step(16, 0, 0.0)  # a clock that did not move teaches nothing
    assert rule.step_seconds(16, 0) == pytest.approx(0.1)
    # Plain steps: the drafting figure drifts back toward the table, and the rule tries again.
    picks = [rule.pick(16) for _ in range(1000)]
    assert picks[0] == 0 and 1 in picks
    assert rule.step_seconds(16, 1) < 0.2
    # A choice that stays dear (three plain steps' time for two tokens): the retries cost
    # under 0.5% of 5,000 steps' time.
    rule, retried = LoadAwareDraftLength(cost, 1), 0
    for _ in range(100):
        rule.observe(1, 1)
    for _ in range(5000):
        if rule.pick(16):
            rule.observe_step(16, 1, 0.3)
            rule.observe(1, 1)
            retried += 1
        else:
            rule.observe_step(16, 0, 0.1)
    assert 0 < retried * (0.3 - 2 * 0.1) < 0.005 * 5000 * 0.1


def test_load_aware_width_follows_the_drafts_confidences():
    from dspark.decoding.draft_length import BatchStepCost, LoadAwareDraftLength
    from dspark.decoding.proposal import Proposal

    # Two sequences; each verified draft adds a fifth of a plain step.
    cost = BatchStepCost(batches=(1, 2), widths=(1, 2, 3, 4, 5), seconds=((0.1,) * 5, (0.1, 0.12, 0.14, 0.16, 0.18)))
    rule = LoadAwareDraftLength(cost, 4)

    def drafts(*conf):
        return Proposal(torch.arange(len(conf)), confidence=torch.tensor(conf))

    sure, unsure = drafts(0.95, 0.95, 0.95, 0.95), drafts(0.9, 0.9, 0.1, 0.1)
    assert rule.width([sure, sure], 2) == 4
    assert rule.width([unsure, unsure], 2) == 2  # past slot 2 the drafts are not worth their rows
    assert rule.width([unsure, sure], 2) == 4  # one sure sequence pays for the width
    assert rule.width([drafts(0.9), Proposal.empty()], 2) == 1
    # A lookup hit (no confidence) counts by the running rates: 0.5 a slot before any data.
    lookup = Proposal(torch.arange(4))
    assert rule.width([lookup, Proposal.empty()], 2) == 1
    for _ in range(100):
        rule.observe(4, 4)
    assert rule.width([lookup, Proposal.empty()], 2) == 4
    assert [len(p) for p in (sure.head(2), sure.head(9), Proposal.empty().head(1))] == [2, 4, 0]


def engine_left_behind(decoder) -> bool:
    return bool(decoder.lengths.any())


def test_greedy_batch_with_the_load_aware_length_is_unchanged(tiny_targets):
    from dspark.decoding.draft_length import LoadAwareDraftLength
    from dspark.decoding.step_timing import measure_batch_cost

    target = tiny_targets["qwen3"]
    torch.manual_seed(0)
    model = untrained_drafter(target)
    aux = tuple(model.config.aux_hidden_state_layer_ids)
    base = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    decoder = SlotDecoder(target.model, slots=4, max_len=96)
    cost = measure_batch_cost(decoder, max_width=4, drafter=base, capture=aux, context=16, repeats=1)
    assert cost.batches == (1, 2, 4) and len(cost.seconds[0]) == 4 and cost.draft_seconds > 0
    assert not engine_left_behind(decoder) and all(t > 0 for row in cost.seconds for t in row)
    with pytest.raises(DSparkError, match="too short to measure"):
        measure_batch_cost(SlotDecoder(target.model, slots=2, max_len=24), max_width=4, drafter=base, capture=aux)
    rule = LoadAwareDraftLength(cost, 3)
    engine = BatchedEngine(decoder, capture=aux, draft_length=rule)
    tok = target.tokenizer
    seqs = [
        Sequence(prompt=tok(p)["input_ids"], max_new_tokens=20, drafter=fork_drafter(base), num_speculative_tokens=3)
        for p in PROMPTS
    ]
    engine.run(seqs)
    for seq in seqs:
        ref = SpeculativeEngine(target).generate(seq.prompt, max_new_tokens=20, stop_token_ids=set())
        assert seq.tokens == ref.tokens
    assert rule.chosen and all(0 <= k <= 3 for k in rule.chosen)


def test_a_sequence_alone_drafts_by_its_confidence_head(tiny_targets):
    from dspark.decoding.draft_length import BatchStepCost, LoadAwareDraftLength

    target = tiny_targets["qwen3"]
    torch.manual_seed(0)
    base = DSparkDrafter(untrained_drafter(target), target_vocab_size=target.vocab_size)
    assert base.model.confidence_head is not None
    tok = target.tokenizer
    prompt = tok(PROMPTS[0])["input_ids"]
    ref = SpeculativeEngine(target).generate(prompt, max_new_tokens=16, stop_token_ids=set())
    widths = (1, 2, 3, 4)
    drafted = {}
    # Alone, each extra token verified costs as much as the first (drafting never pays at an
    # untrained head's ~0.5 confidences), or nothing (drafting always pays); at 4 sequences
    # the rule's own table.
    for name, alone in (("dear", (0.01, 0.02, 0.03, 0.04)), ("free", (0.01,) * 4)):
        cost = BatchStepCost(batches=(1, 4), widths=widths, seconds=(alone, (0.05,) * 4))
        rule = LoadAwareDraftLength(cost, 3)
        engine = BatchedEngine(SlotDecoder(target.model, slots=4, max_len=96), capture=tuple(base.aux_layer_ids))
        engine.draft_length = rule
        seq = Sequence(prompt=prompt, max_new_tokens=16, drafter=fork_drafter(base), num_speculative_tokens=3)
        engine.add(seq)
        drafts = 0
        while engine.active:
            engine.step()
            drafts += engine.last_step[1]
        assert seq.tokens == ref.tokens  # the rule changes how many drafts, never the output
        assert seq.drafter.step_cost is None  # the one-sequence cost was lent for the step only
        assert rule.chosen == []  # the batch rule was not asked
        drafted[name] = drafts
    assert drafted["dear"] == 0 < drafted["free"]


@pytest.mark.parametrize(
    "options",
    [
        {"markov_head_type": "vanilla"},
        {"markov_head_type": "rnn"},
        {"sample_from_anchor": False, "enable_confidence_head": False},  # DFlash's slot layout
    ],
)
def test_drafting_together_equals_drafting_alone(tiny_targets, options):
    """`propose_batch`: several sequences' blocks in one forward (contexts of different
    lengths, pending rows, mixed draft lengths, greedy and sampled rows) give each sequence
    the drafts, distributions and confidences its own `propose` gives."""
    from dspark.decoding.drafters import propose_batch
    from dspark.decoding.sampling import SamplingParams

    target = tiny_targets["qwen3"]
    torch.manual_seed(1)
    model = untrained_drafter(target, num_layers=2, **options)
    aux_ids = tuple(model.config.aux_hidden_state_layer_ids)
    base = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    lengths, pending, ks = [5, 11, 2, 8], [0, 3, 1, 0], [7, 3, 0, 5]
    params = [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95), SamplingParams(), SamplingParams(1.0)]
    pairs = []
    for i, (n, p) in enumerate(zip(lengths, pending, strict=True)):
        ids = torch.randint(5, target.vocab_size, (n + p,), generator=torch.Generator().manual_seed(i))
        target.reset()
        states = target.forward(ids, capture=aux_ids).aux_hidden
        pair = []
        for _ in range(2):  # one drafter proposes alone, its twin in the batch
            d = fork_drafter(base)
            d.begin(ids[:n], states[:n])
            if p:
                d.accept(ids[n:], states[n:])
            pair.append(d)
        pairs.append(pair)
    anchors = [7, 8, 9, 10]
    alone = [
        d.propose(a, k, prm, torch.Generator().manual_seed(50 + i))
        for i, ((d, _), a, k, prm) in enumerate(zip(pairs, anchors, ks, params, strict=True))
    ]
    together = propose_batch(
        [twin for _, twin in pairs], anchors, ks, params, [torch.Generator().manual_seed(50 + i) for i in range(4)]
    )
    for one, both, k in zip(alone, together, ks, strict=True):
        assert both.tokens.tolist() == one.tokens.tolist() and len(both) == k
        if one.probs is not None:
            torch.testing.assert_close(both.probs, one.probs, rtol=1e-4, atol=1e-5)
        if k and one.confidence is not None:
            torch.testing.assert_close(both.confidence, one.confidence, rtol=1e-4, atol=1e-5)
        assert (both.confidence is None) == (one.confidence is None)
    # Both drafters took their pending rows (the prompt's too) into the context the same way;
    # one that drafted nothing did no context work at all (k = 0: its rows still wait).
    for (one, twin), k in zip(pairs, ks, strict=True):
        assert twin._ctx_len == one._ctx_len and len(twin._pending) == len(one._pending)
        assert bool(one._kv) == bool(k) and len(twin._kv) == len(one._kv)
        if k:
            torch.testing.assert_close(twin._kv[0][0], one._kv[0][0], rtol=1e-4, atol=1e-5)


def test_lookup_first_drafters_in_a_batch_draft_their_model_steps_together(tiny_targets):
    """Prompt lookup first, DSpark otherwise, in a batch: lookup hits draft alone for free,
    the misses draft together; greedy output equals plain decoding's."""
    from dspark.decoding import LookupFirstDrafter

    target = tiny_targets["llama"]
    torch.manual_seed(0)
    model = untrained_drafter(target)
    aux = tuple(model.config.aux_hidden_state_layer_ids)
    base = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    engine = BatchedEngine(SlotDecoder(target.model, slots=4, max_len=128), capture=aux)
    tok = target.tokenizer
    texts = ["a b c a b c a b", "one two one two one", "x y z", "for i in range(10): for i in"]
    seqs = [
        Sequence(
            prompt=tok(t)["input_ids"],
            max_new_tokens=24,
            drafter=LookupFirstDrafter(fork_drafter(base), target.vocab_size, min_ngram=1),
            num_speculative_tokens=4,
        )
        for t in texts
    ]
    engine.run(seqs)
    for seq in seqs:
        ref = SpeculativeEngine(target).generate(seq.prompt, max_new_tokens=24, stop_token_ids=set())
        assert seq.tokens == ref.tokens
    assert sum(s.drafter.lookup_steps for s in seqs) > 0 and sum(s.drafter.model_steps for s in seqs) > 0


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_bf16_slots_give_a_sequence_the_same_logits_whatever_its_batch(tiny_target_dirs, arch):
    """In bf16 the logits of a sequence must not depend on the other sequences of its batch:
    neither on their number (one-row products, `small_rows`) nor on their lengths (CPU
    attention over the allocated block, whose result does not depend on the block's length;
    SDPA's kv split follows it). Bitwise, at every step."""
    from dspark.target import TargetModel

    target = TargetModel.from_pretrained(tiny_target_dirs[arch], dtype=torch.bfloat16)
    prompt = list(range(3, 40))
    runs = []
    for others in ([], [90], [12, 150, 60]):
        decoder = SlotDecoder(target.model, slots=1 + len(others), max_len=256)
        logits = [decoder.prefill(0, prompt)]
        for s, n in enumerate(others, start=1):
            decoder.prefill(s, [(7 * j + s) % 200 + 3 for j in range(n)])
        for step in range(6):
            width = 1 + step % 3  # plain steps and verification blocks
            rows = [[int(logits[-1].argmax())] * width] + [[5] * (1 + (step + s) % 4) for s in range(len(others))]
            logits.append(decoder.extend(rows)[0][0][-1])
            decoder.set_length(0, int(decoder.lengths[0]) - width + 1)  # keep one token a step
        runs.append(torch.stack(logits))
    for run in runs[1:]:
        assert torch.equal(run, runs[0])
