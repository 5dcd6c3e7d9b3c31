"""`sample_rows`: the filtered distribution over each row's top candidates is `probabilities`'
distribution, and a row whose nucleus the candidates do not hold falls back to the vocabulary."""

import pytest
import torch

from dspark.decoding.sampling import CANDIDATES, SamplingParams, candidates, probabilities, sample_rows

VOCAB = 3 * CANDIDATES


def rows() -> torch.Tensor:
    torch.manual_seed(0)
    peaked = torch.randn(VOCAB) * 6  # a nucleus of a few hundred tokens at most
    flat = torch.randn(VOCAB) * 0.01  # a nucleus of ~95% of the vocabulary
    spiky = torch.full((VOCAB,), -20.0)
    spiky[[5, 700, 2500]] = torch.tensor([3.0, 2.5, 2.0])
    return torch.stack([peaked, flat, spiky])


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_p=0.95),
        SamplingParams(temperature=0.7, top_p=0.5),
        SamplingParams(temperature=1.3, top_k=50),
        SamplingParams(temperature=1.0, top_k=50, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=2 * CANDIDATES, top_p=0.9),
        SamplingParams(temperature=1.0),
    ],
)
def test_candidates_give_the_filtered_distribution(params):
    logits = rows()
    probs, ids, fits = candidates(logits, params)
    want = probabilities(logits, params)
    for i in range(logits.shape[0]):
        if not fits[i]:
            continue
        got = torch.zeros(VOCAB).scatter(0, ids[i], probs[i])
        assert torch.allclose(got, want[i], atol=1e-6), (i, params)
    if params.top_k == 50 and params.top_p == 1.0:
        # The spiky row's 50th value is tied with thousands more, which a top-k keeps whole.
        assert fits.tolist() == [True, True, False]
    if params.top_p == 0.95:
        assert fits.tolist() == [True, False, True]  # the flat row's nucleus is most of the vocabulary


def test_sample_rows_draws_from_the_support_with_each_rows_generator():
    logits = rows()
    params = SamplingParams(temperature=1.0, top_p=0.95)
    support = probabilities(logits, params) > 0

    def draw(seed: int) -> list[int]:
        gens = [torch.Generator().manual_seed(seed + i) for i in range(logits.shape[0])]
        return sample_rows(logits, params, gens)

    for seed in range(20):
        got = draw(seed)
        assert all(bool(support[i, t]) for i, t in enumerate(got))
        assert got == draw(seed)  # reproducible from the rows' own generators
    # The spiky row: 5 is three times as likely as 700 under the target's distribution.
    counts = torch.bincount(torch.tensor([draw(s)[2] for s in range(600)]), minlength=VOCAB)
    p = probabilities(logits[2:3], params)[0]
    assert counts[5] / 600 == pytest.approx(float(p[5]), abs=0.06)
    with pytest.raises(ValueError, match="greedy"):
        sample_rows(logits, SamplingParams(), [None] * 3)
