"""Speculative sampling through the whole engine follows the target's distribution.

Target: tiny random Qwen3 with top_k=3 so three generated tokens have at most 27
outcomes, whose exact probabilities we enumerate with plain target forwards. The drafter
samples from a *different* distribution (temperature 1.6x the target's), so both the
accept and the reject paths run. Tolerance: total variation < 0.06 over 3000 runs
(expected sampling noise ≈ 0.03; a wrong residual or acceptance rule gives > 0.1).
"""

import itertools

import torch
from helpers import ModelDrafter

from dspark.decoding import SamplingParams, SpeculativeEngine
from dspark.decoding.sampling import probabilities

PARAMS = SamplingParams(temperature=1.0, top_k=3)


def exact_joint(target, prompt, length):
    joint = {}
    model = target.model

    def dist(seq):
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
        return probabilities(logits, PARAMS)

    frontier = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for prefix, mass in frontier.items():
            p = dist(prompt + list(prefix))
            for tok in torch.nonzero(p).flatten().tolist():
                nxt[(*prefix, tok)] = mass * float(p[tok])
        frontier = nxt
    joint.update(frontier)
    return joint


def sampled_tv(engine, prompt, exact, *, seed: int, n: int = 3000) -> tuple[float, int, int]:
    """TV between n sampled 3-token outputs and the exact joint; drafts accepted and sent."""
    gen = torch.Generator().manual_seed(seed)
    counts = dict.fromkeys(exact, 0)
    accepted = drafted = 0
    for _ in range(n):
        r = engine.generate(prompt, max_new_tokens=3, params=PARAMS, generator=gen, stop_token_ids=set())
        counts[tuple(r.tokens)] += 1
        accepted += sum(r.position_accepts)
        drafted += r.drafted_tokens
    return 0.5 * sum(abs(counts[key] / n - exact[key]) for key in exact), accepted, drafted


def test_speculative_sampling_matches_target_joint(tiny_targets):
    target = tiny_targets["qwen3"]
    prompt = target.tokenizer("for i in")["input_ids"]
    exact = exact_joint(target, prompt, 3)
    engine = SpeculativeEngine(target, ModelDrafter(target, temperature_scale=1.6), num_speculative_tokens=2)
    tv, accepted, drafted = sampled_tv(engine, prompt, exact, seed=7)
    assert tv < 0.06, f"TV {tv:.3f}"
    assert 0 < accepted < drafted  # some drafts accepted, some rejected
    assert len(list(itertools.islice(exact, 2))) == 2


def test_lookup_first_sampling_matches_target_joint(tiny_targets):
    """Lookup drafts are point masses (q = 1): accept with p, else resample from the residual.
    Through LookupFirstDrafter the output still follows the target's distribution."""
    from dspark.decoding import LookupFirstDrafter

    target = tiny_targets["qwen3"]
    # Every token id occurs once before the question, so the 1-gram lookup always finds the
    # anchor and drafts what followed it: arbitrary tokens, which the target rejects.
    prompt = list(range(target.vocab_size)) + target.tokenizer("for i in")["input_ids"]
    exact = exact_joint(target, prompt, 3)
    drafter = LookupFirstDrafter(ModelDrafter(target, temperature_scale=1.6), target.vocab_size, min_ngram=1)
    engine = SpeculativeEngine(target, drafter, num_speculative_tokens=2)
    n = 3000
    tv, accepted, drafted = sampled_tv(engine, prompt, exact, seed=11, n=n)
    assert tv < 0.06, f"TV {tv:.3f}"
    assert drafter.lookup_steps >= n and drafter.model_steps == 0
    assert drafted >= n and accepted < drafted  # the accept path of point masses: test_verify.py
