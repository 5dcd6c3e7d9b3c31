"""The verifiers on hand-built scores: exact tokens for never / always / sometimes accept."""

import pytest
import torch

from dspark.decoding.verify import verify_greedy, verify_sampling


def onehot_logits(ids, vocab=8):
    logits = torch.zeros(len(ids), vocab)
    logits[torch.arange(len(ids)), torch.tensor(ids)] = 5.0
    return logits


def test_greedy_never_accepts():
    v = verify_greedy(torch.tensor([1, 2, 3]), onehot_logits([4, 2, 3, 5]))
    assert v.num_accepted == 0
    assert v.tokens == [4]


def test_greedy_always_accepts_and_emits_bonus():
    v = verify_greedy(torch.tensor([1, 2, 3]), onehot_logits([1, 2, 3, 7]))
    assert v.num_accepted == 3
    assert v.tokens == [1, 2, 3, 7]


def test_greedy_sometimes_accepts_then_corrects():
    v = verify_greedy(torch.tensor([1, 2, 3]), onehot_logits([1, 6, 3, 7]))
    assert v.num_accepted == 1
    assert v.tokens == [1, 6]


def test_greedy_with_no_drafts_is_plain_decoding():
    v = verify_greedy(torch.empty(0, dtype=torch.long), onehot_logits([5]))
    assert (v.num_accepted, v.tokens) == (0, [5])


def test_greedy_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"K\+1"):
        verify_greedy(torch.tensor([1, 2]), onehot_logits([1, 2]))
    with pytest.raises(ValueError, match="lie in"):
        verify_greedy(torch.tensor([9]), onehot_logits([1, 2]))


def test_sampling_accepts_when_draft_matches_a_certain_target():
    p = torch.zeros(3, 4)
    p[0, 2] = p[1, 1] = p[2, 3] = 1.0
    q = p[:2].clone()
    v = verify_sampling(torch.tensor([2, 1]), q, p, torch.Generator().manual_seed(0))
    assert v.num_accepted == 2
    assert v.tokens == [2, 1, 3]


def test_sampling_never_accepts_a_token_the_target_excludes():
    p = torch.zeros(2, 4)
    p[0, 0] = 1.0
    p[1, 3] = 1.0
    q = torch.zeros(1, 4)
    q[0, 2] = 1.0
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        v = verify_sampling(torch.tensor([2]), q, p, gen)
        assert v.num_accepted == 0
        assert v.tokens == [0]  # the residual max(p - q, 0) is all on token 0


def test_sampling_rejects_a_draft_with_zero_draft_probability():
    p = torch.full((2, 4), 0.25)
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="zero draft probability"):
        verify_sampling(torch.tensor([0]), q, p, None)


def test_sampling_a_point_mass_draft_follows_the_target():
    """A deterministic drafter (prompt lookup) sends q = 1 on its token: accepted with
    probability p(token), otherwise the token comes from p without it. Either way the emitted
    token has the target's law. TV < 0.02 over 20k draws (sampling noise ~ 0.006)."""
    from dspark.decoding.drafters import point_mass

    gen = torch.Generator().manual_seed(99)
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    drafts = torch.tensor([1])
    q = point_mass(drafts, 4)
    n = 20_000
    counts = torch.zeros(4)
    accepted = 0
    for _ in range(n):
        v = verify_sampling(drafts, q, p, gen)
        accepted += v.num_accepted
        counts[v.tokens[0]] += 1
    tv = 0.5 * (counts / n - p[0]).abs().sum().item()
    assert tv < 0.02, f"TV {tv:.4f}"
    assert abs(accepted / n - 0.3) < 0.02


def test_sampling_output_follows_the_target_distribution():
    """Statistical: the emitted pair (x1, x2) has the target's joint law.

    Vocab 4, K = 2 drafts from a q that differs from p. The joint of the first two
    emitted tokens must equal p0(x1)·p1(x2) (p1 does not depend on x1 here).
    Tolerance: total variation < 0.02 over 40k draws (sampling noise ≈ 0.006).
    """
    gen = torch.Generator().manual_seed(1234)
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.1, 0.1, 0.4, 0.4], [0.7, 0.1, 0.1, 0.1]])
    n = 40_000
    counts = torch.zeros(4, 4)
    accepted = 0
    for _ in range(n):
        drafts = torch.stack([torch.multinomial(q[j], 1, generator=gen)[0] for j in range(2)])
        v = verify_sampling(drafts, q, p, gen)
        accepted += v.num_accepted
        if len(v.tokens) >= 2:
            x1, x2 = v.tokens[0], v.tokens[1]
        else:  # rejected at slot 0: x1 is the correction; draw x2 from p1 as the next step would
            x1, x2 = v.tokens[0], int(torch.multinomial(p[1], 1, generator=gen))
        counts[x1, x2] += 1
    empirical = counts / n
    expected = p[0][:, None] * p[1][None, :]
    tv = 0.5 * (empirical - expected).abs().sum().item()
    assert tv < 0.02, f"TV {tv:.4f}"
    assert 0 < accepted < 2 * n  # both accept and reject paths were exercised


def test_row_wise_greedy_verify_equals_the_full_one_and_asks_only_what_it_needs():
    from dspark.decoding.verify import verify_greedy_rows

    gen = torch.Generator().manual_seed(0)
    for k in range(8):
        for trial in range(40):
            logits = torch.randn(k + 1, 11, generator=gen)
            choice = logits.argmax(-1)
            drafts = choice[:k].clone()
            cut = int(torch.randint(0, k + 1, (1,), generator=gen))  # first wrong draft (k: none)
            if cut < k:
                drafts[cut] = (drafts[cut] + 1 + trial % 10) % 11
            asked = []

            def rows(start, stop, logits=logits, asked=asked):
                asked.append((start, stop))
                return logits[start:stop]

            got = verify_greedy_rows(drafts, rows, first=2)
            assert got == verify_greedy(drafts, logits)
            assert got.num_accepted == cut
            needed = cut + 1
            assert asked[0] == (0, min(k + 1, 2))
            assert asked[-1][1] >= needed  # every row it decided on was asked for
            assert asked == [(0, min(k + 1, 2))] if needed <= 2 else asked == [(0, 2), (2, k + 1)]


def test_row_wise_greedy_verify_rejects_bad_input():
    from dspark.decoding.verify import verify_greedy_rows

    with pytest.raises(ValueError, match="must lie in"):
        verify_greedy_rows(torch.tensor([9]), lambda a, b: onehot_logits([1, 2])[a:b])
    with pytest.raises(ValueError, match=r"must return \[2, V\]"):
        verify_greedy_rows(torch.tensor([1]), lambda a, b: onehot_logits([1]))


def test_row_wise_sampling_verify_draws_like_the_full_one_and_asks_only_what_it_needs():
    from dspark.decoding.verify import verify_sampling_rows

    gen = torch.Generator().manual_seed(1)
    for k in range(8):
        for trial in range(30):
            q = torch.softmax(torch.randn(k, 9, generator=gen) * 2, dim=-1)
            p = torch.softmax(torch.randn(k + 1, 9, generator=gen) * 2, dim=-1)
            drafts = torch.multinomial(q, 1, generator=gen)[:, 0] if k else torch.empty(0, dtype=torch.long)
            asked = []

            def rows(start, stop, p=p, asked=asked):
                asked.append((start, stop))
                return p[start:stop]

            seed = 1000 * k + trial
            got = verify_sampling_rows(drafts, q, rows, torch.Generator().manual_seed(seed), first=2)
            want = verify_sampling(drafts, q, p, torch.Generator().manual_seed(seed))
            assert got == want
            needed = got.num_accepted + 1
            assert asked[0] == (0, min(k + 1, 2))
            assert asked == [(0, min(k + 1, 2))] if needed <= 2 else asked == [(0, 2), (2, k + 1)]


def test_row_wise_sampling_verify_rejects_bad_input():
    from dspark.decoding.verify import verify_sampling_rows

    q = torch.full((1, 4), 0.25)
    with pytest.raises(ValueError, match=r"must be \[2, 4\]"):
        verify_sampling_rows(torch.tensor([1]), q, lambda a, b: torch.full((1, 4), 0.25), None)
    with pytest.raises(ValueError, match="must lie in"):
        verify_sampling_rows(torch.tensor([7]), q, lambda a, b: torch.full((b - a, 4), 0.25), None)
