"""What a drafter proposes for one step: its draft tokens, and with them what verification
and the draft-length rules read (the exact draft distributions under sampling, the
confidence head's per-slot acceptance predictions)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Proposal:
    tokens: torch.Tensor  # [k] target ids
    probs: torch.Tensor | None = None  # [k, V] exact draft distributions (sampling only)
    confidence: torch.Tensor | None = None  # [k] per-slot acceptance predictions

    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> Proposal:
        return cls(tokens=torch.empty(0, dtype=torch.long, device=device))

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def head(self, n: int) -> Proposal:
        """The first ``n`` drafts (verifying a prefix of a draft is as lossless as the whole)."""
        if n >= len(self):
            return self
        return Proposal(
            self.tokens[:n],
            None if self.probs is None else self.probs[:n],
            None if self.confidence is None else self.confidence[:n],
        )
