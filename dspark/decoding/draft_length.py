"""Draft length from a measured cost model (DESIGN §3, confidence-scheduled verification).

A decode step costs ``d + T(m)``: drafting ``d`` (one block forward and the head loop) plus
one target forward over ``m`` new tokens (the anchor and ``m - 1`` drafts). ``T`` is not
linear: on CPUs a single token takes a matrix-vector path and two or more a
matrix-multiply one, so the first draft is the expensive one. Both are measured on the
machine that decodes (`dspark.decoding.step_timing.measure_step_cost`), once per drafter,
outside the timed loop.

The confidence head gives ``c_j`` = P(slot j accepted | earlier slots accepted), so with
``S_j = c_0 ... c_j`` a step that verifies ``n`` drafts emits ``E(n) = 1 + S_0 + ... +
S_{n-1}`` tokens on average. The rule picks the draft length that maximises
``E(n) / (d + T(n + 1))`` — tokens per second — while it drafts, as an early-stopping
rule: at slot ``j`` it knows ``c_0 .. c_j`` only, extrapolates later slots with ``c_j``
(a geometric tail), and stops before slot ``j`` when no length that includes it beats
stopping there. Whether slot ``j`` is verified depends only on the drafts before it, so
rejection sampling stays exact and greedy output unchanged.

A batch of sequences (`dspark.decoding.batch.BatchedEngine`) has its own rule,
`LoadAwareDraftLength`: one length per step for the whole batch from ``T(batch, tokens)``
(`step_timing.measure_batch_cost`, a `BatchStepCost`, corrected by the steps it has timed since)
and the acceptance seen so far, zero included, then the step's width from the drafts' confidences.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dspark.errors import DSparkError

if TYPE_CHECKING:
    from dspark.decoding.proposal import Proposal


@dataclass(frozen=True)
class StepCost:
    """``verify_seconds[m - 1]`` = one target forward over ``m`` new tokens; ``draft_seconds``
    = one full proposal. Seconds on the machine that measured them."""

    verify_seconds: tuple[float, ...]
    draft_seconds: float

    def __post_init__(self) -> None:
        if not self.verify_seconds or any(not t > 0 for t in self.verify_seconds) or self.draft_seconds < 0:
            raise DSparkError(f"step cost needs positive verify times and a draft time >= 0, got {self}")

    @property
    def max_drafts(self) -> int:
        return len(self.verify_seconds) - 1

    def step_seconds(self, drafts: int) -> float:
        return self.draft_seconds + self.verify_seconds[drafts]

    def include(self, expected: float, survival: float, c: float, j: int, k: int) -> bool:
        """Verify slot ``j`` (0-based)? ``expected`` = E(j) from slots before it, ``survival`` =
        S_j (its own confidence included), ``c`` = c_j, ``k`` = the most drafts allowed."""
        k = min(k, self.max_drafts)
        if j >= k:
            return False
        stop = expected / self.step_seconds(j)
        gain, term = 0.0, survival
        for n in range(j + 1, k + 1):  # verify slots j .. n-1
            gain += term
            term *= c
            if (expected + gain) / self.step_seconds(n) > stop:
                return True
        return False

    def expected_best(self, confidences: list[float], k: int) -> tuple[int, float]:
        """(n, tokens/s) maximising E(n) / (d + T(n+1)) for known confidences (for reports)."""
        k = min(k, self.max_drafts, len(confidences))
        best, best_rate, expected, survival = 0, 1.0 / self.step_seconds(0), 1.0, 1.0
        for n in range(1, k + 1):
            survival *= confidences[n - 1]
            expected += survival
            rate = expected / self.step_seconds(n)
            if rate > best_rate:
                best, best_rate = n, rate
        return best, best_rate

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> StepCost:
        try:
            return cls(tuple(float(t) for t in data["verify_seconds"]), float(data["draft_seconds"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise DSparkError(f"step cost: expected verify_seconds (list) and draft_seconds, got {data!r}") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> StepCost:
        p = Path(path)
        if not p.is_file():
            raise DSparkError(f"{p}: step cost file not found")
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise DSparkError(f"{p}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise DSparkError(f"{p}: expected a JSON object with verify_seconds and draft_seconds")
        return cls.from_dict(data)


@dataclass(frozen=True)
class BatchStepCost:
    """Seconds of one batched step on this machine: ``seconds[(b, w)]`` for ``b`` sequences
    of ``w`` tokens each (the anchor and ``w - 1`` drafts), measured by `step_timing.measure_batch_cost`
    as the engine runs it: with a drafter, its proposals, the capture of its layers and the
    bookkeeping are in the figure. ``draft_seconds``: one sequence's proposal of the most
    drafts, for reports."""

    batches: tuple[int, ...]
    widths: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]  # [batch index][width index]
    draft_seconds: float = 0.0

    def nearest_batch(self, b: int) -> int:
        """The measured batch size nearest ``b`` (by ratio)."""
        return min(self.batches, key=lambda m: max(m, b) / min(m, b))

    def step_seconds(self, b: int, w: int) -> float:
        """Interpolated linearly in the batch size, at the nearest measured width at or above ``w``."""
        wi = next((i for i, x in enumerate(self.widths) if x >= w), len(self.widths) - 1)
        col = [row[wi] for row in self.seconds]
        if b <= self.batches[0]:
            return col[0] * b / self.batches[0]
        for i in range(1, len(self.batches)):
            b0, b1, t0, t1 = self.batches[i - 1], self.batches[i], col[i - 1], col[i]
            if b <= b1:
                return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
        return col[-1] * b / self.batches[-1]


class LoadAwareDraftLength:
    """One draft length per step for the whole batch, from the measured step cost and the
    acceptance this server has seen: ``k`` maximising ``b · E(k) / T(b, k + 1)``
    tokens per second, where ``E(k) = 1 + a_1 + a_1 a_2 + ...`` from running per-position
    acceptance rates ``a_j`` (exponentially weighted; optimistic 0.5 before any data) and
    ``T`` the measured step, drafting included, corrected by this server's own steps
    (`observe_step`). ``k = 0`` (a plain step) is a choice: under
    load a full batch of drafts can cost more than it brings. A length that drafts must beat
    the plain step by ``margin`` (a share of its rate): the table is measured on a shared
    machine, and a gain inside its error is a coin toss that plain decoding never loses. The
    rule looks only at past steps and clocks, so verification and its guarantees are
    untouched. Once a step drafts ``k``, `width` sets how many of them (at most ``k``) the
    batch verifies from the drafts' own confidences."""

    def __init__(
        self,
        cost: BatchStepCost,
        max_drafts: int,
        *,
        decay: float = 0.98,
        margin: float = 0.05,
        time_decay: float = 0.95,
        time_drift: float = 0.995,
    ) -> None:
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self.cost, self.max_drafts, self.decay = cost, min(max_drafts, cost.widths[-1] - 1), decay
        self.margin = margin
        self.time_decay, self.time_drift = time_decay, time_drift
        # (measured batch, drafts) -> [weight, weighted sum] of measured / table step seconds;
        # the prior is one step at the table's figure.
        self._timing: dict[tuple[int, int], list[float]] = {}
        self._solo: StepCost | None = None
        self.attempts = [1.0] * self.max_drafts  # prior: one attempt, half accepted
        self.accepts = [0.5] * self.max_drafts
        self.chosen: list[int] = []  # the length picked at each step (for reports)

    def pick(self, b: int) -> int:
        if self.chosen and self.chosen[-1] == 0:
            # Nothing is observed while no one drafts: the estimates drift back toward the
            # prior, so the rule tries drafting again after a while (and learns if it pays).
            # The drafting steps' timings drift back toward the table too, more slowly (a
            # retry of a choice that stays dear costs a few dear steps), so a choice that a
            # passing load made dear is tried again after a few hundred plain steps.
            for j in range(self.max_drafts):
                self.attempts[j] = self.decay * self.attempts[j] + (1 - self.decay) * 1.0
                self.accepts[j] = self.decay * self.accepts[j] + (1 - self.decay) * 0.5
            for key, (weight, total) in self._timing.items():
                if key[1]:
                    self._timing[key] = [
                        self.time_drift * weight + (1 - self.time_drift),
                        self.time_drift * total + (1 - self.time_drift),
                    ]
        best, best_rate = 0, (1.0 + self.margin) * b / self.step_seconds(b, 0)
        expected, survival = 1.0, 1.0
        for k in range(1, self.max_drafts + 1):
            survival *= self.accepts[k - 1] / self.attempts[k - 1]
            expected += survival
            rate = b * expected / self.step_seconds(b, k)
            if rate > best_rate:
                best, best_rate = k, rate
        self.chosen.append(best)
        return best

    def width(self, proposals: list[Proposal], b: int) -> int:
        """After drafting: how many drafts every sequence verifies this step, ``w`` from 1 to
        the longest proposal maximising ``sum_s E_s(w) / T(b, w + 1)``, with ``E_s`` from the
        proposal's own per-slot confidences where its drafter has a confidence head (a
        lookup hit or a head-less drafter: the running rates). The batch's forward is as wide
        as its widest row, so a sequence verifies up to ``w`` drafts at no extra cost; the
        drafting is paid by now and every ``T(b, w + 1)`` with ``w >= 1`` holds it alike. The
        choice reads no target output, so verification stays exact."""
        longest = max((len(p) for p in proposals), default=0)
        if longest <= 1:
            return longest
        rates = [a / n for a, n in zip(self.accepts, self.attempts, strict=True)]
        gains = [0.0] * (longest + 1)  # gains[w]: the batch's expected tokens from slot w - 1
        for p in proposals:
            conf = p.confidence.tolist() if p.confidence is not None else None
            survival = 1.0
            for j in range(len(p)):
                survival *= conf[j] if conf is not None else rates[min(j, len(rates) - 1)]
                gains[j + 1] += survival
        best, best_rate, expected = 1, 0.0, float(b)
        for w in range(1, longest + 1):
            expected += gains[w]
            rate = expected / self.cost.step_seconds(b, w + 1)
            if rate > best_rate:
                best, best_rate = w, rate
        return best

    def solo_cost(self) -> StepCost:
        """The one-sequence engine's cost model from the table's batch-of-one row: T(1, m)
        for 1 .. max_drafts + 1 tokens, drafting included (so no separate draft time)."""
        if self._solo is None:
            widths = range(1, self.max_drafts + 2)
            self._solo = StepCost(tuple(self.cost.step_seconds(1, w) for w in widths), 0.0)
        return self._solo

    def _timing_key(self, b: int, k: int) -> tuple[int, int]:
        return self.cost.nearest_batch(b), k

    def step_seconds(self, b: int, k: int) -> float:
        """What a step of ``b`` sequences at draft length ``k`` costs: the start-up table's
        ``T(b, k + 1)`` times the running ratio of this server's measured steps to the table
        (`observe_step`) at the nearest measured batch size."""
        weight, total = self._timing.get(self._timing_key(b, k), (1.0, 1.0))
        return self.cost.step_seconds(b, k + 1) * total / weight

    def observe_step(self, b: int, k: int, seconds: float) -> None:
        """A step of ``b`` sequences at the length ``k`` this rule picked took ``seconds``,
        drafting and verification included (the width trimmed it to at most ``k`` drafts).
        The table is measured once at start-up, on a shared machine, over a short context:
        its figure for a choice can be off by half or more (a batch of 16 measured 1.2x a
        plain step for one draft, then ran 2x). Every choice's steps correct it, an
        exponentially weighted mean of measured / table (``time_decay``); a choice never made
        keeps its table figure. While the rule plain-steps, the drafting choices' figures
        drift back toward the table (as the acceptance rates toward their prior), so it
        tries a choice made dear by a passing load again now and then."""
        if not seconds > 0:
            return
        key = self._timing_key(b, k)
        weight, total = self._timing.get(key, (1.0, 1.0))
        ratio = seconds / self.cost.step_seconds(b, k + 1)
        self._timing[key] = [self.time_decay * weight + 1.0, self.time_decay * total + ratio]

    def observe(self, drafted: int, accepted: int) -> None:
        """One sequence's step: ``drafted`` drafts verified, the first ``accepted`` accepted."""
        for j in range(min(drafted, accepted + 1)):
            self.attempts[j] = self.decay * self.attempts[j] + 1
            self.accepts[j] = self.decay * self.accepts[j] + (1.0 if j < accepted else 0.0)
