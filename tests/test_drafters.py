"""Drafter internals that the lossless tests cannot see: what gets drafted."""

import random

import torch

from dspark.decoding.drafters import NgramDrafter
from dspark.decoding.sampling import SamplingParams


def scan_lookup(seq: list[int], k: int, min_ngram: int, max_ngram: int) -> list[int]:
    """Reference: for n = max .. min, the continuation of the latest earlier match of seq's last n."""
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        tail = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start : start + n] == tail:
                return seq[start + n : start + n + k]
    return []


def test_indexed_ngram_lookup_drafts_what_a_scan_drafts():
    """The n-gram index gives the drafts of a backward scan, step by step as text is accepted
    (small vocabularies, so matches of every length and at the very end occur)."""
    rng = random.Random(0)
    checked = found = 0
    for trial in range(60):
        vocab = rng.choice([3, 5, 20])
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 4)
        drafter = NgramDrafter(vocab, min_ngram=lo, max_ngram=hi)
        seq = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        drafter.begin(torch.tensor(seq), None)
        for _ in range(20):
            anchor, k = rng.randrange(vocab), rng.randint(1, 8)
            got = drafter.propose(anchor, k, SamplingParams(), None).tokens.tolist()
            assert got == scan_lookup([*seq, anchor], k, lo, hi), (trial, seq, anchor, k)
            checked += 1
            found += bool(got)
            accepted = [anchor, *[rng.randrange(vocab) for _ in range(rng.randint(0, 3))]]
            drafter.accept(torch.tensor(accepted), None)
            seq += accepted
    assert checked == 1200 and 0 < found < checked
