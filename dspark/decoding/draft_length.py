"""Draft length from a measured cost model (DESIGN §3, confidence-scheduled verification).

A decode step costs ``d + T(m)``: drafting ``d`` (one block forward and the head loop) plus
one target forward over ``m`` new tokens (the anchor and ``m - 1`` drafts). ``T`` is not
linear: on CPUs a single token takes a matrix-vector path and two or more a
matrix-multiply one, so the first draft is the expensive one. Both are measured on the
machine that decodes (`measure_step_cost`), once per drafter, outside the timed loop.

The confidence head gives ``c_j`` = P(slot j accepted | earlier slots accepted), so with
``S_j = c_0 ... c_j`` a step that verifies ``n`` drafts emits ``E(n) = 1 + S_0 + ... +
S_{n-1}`` tokens on average. The rule picks the draft length that maximises
``E(n) / (d + T(n + 1))`` — tokens per second — while it drafts, as an early-stopping
rule: at slot ``j`` it knows ``c_0 .. c_j`` only, extrapolates later slots with ``c_j``
(a geometric tail), and stops before slot ``j`` when no length that includes it beats
stopping there. Whether slot ``j`` is verified depends only on the drafts before it, so
rejection sampling stays exact and greedy output unchanged.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dspark.decoding.verify import FIRST_ROWS
from dspark.errors import DSparkError


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


def median_seconds(run, repeats: int = 3) -> float:
    """The median wall time of ``repeats`` calls of ``run`` (no warm-up call)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def monotone_costs(seconds: list[float]) -> list[float]:
    """Noise on a shared machine only ever adds time, and a forward over more tokens does not
    cost less: keep T(m) = min over m' >= m of the measured T(m'), a non-decreasing curve."""
    out = list(seconds)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


@torch.inference_mode()
def measure_step_cost(target, drafter, *, repeats: int = 5, context_tokens: int = 96) -> StepCost:
    """Median wall time of target forwards over 1 .. max_draft_tokens + 1 new tokens after a
    ``context_tokens`` prefix (made non-decreasing, `monotone_costs`), and of one full
    proposal. Leaves the target's cache empty."""
    from dspark.decoding.sampling import SamplingParams

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if context_tokens < 8 + drafter.max_draft_tokens + 1:
        raise ValueError(f"context_tokens must be >= {8 + drafter.max_draft_tokens + 1}, got {context_tokens}")
    k = drafter.max_draft_tokens
    device = target.device
    saved_cost = getattr(drafter, "step_cost", None)
    if saved_cost is not None:
        drafter.step_cost = None  # time the full block
    sync = torch.cuda.synchronize if device.type == "cuda" and torch.cuda.is_available() else (lambda: None)
    # Any in-vocab ids do: costs depend on shapes, not on which tokens.
    ids = (torch.arange(context_tokens, device=device) * 7919 + 11) % target.vocab_size
    capture = tuple(getattr(drafter, "aux_layer_ids", ()))
    target.reset()
    step = target.forward(ids, capture=capture)
    # Repeats go round-robin over the shapes, so a slow spell of a shared machine touches
    # every shape alike instead of one; the first round is a warm-up.
    times: list[list[float]] = [[] for _ in range(k + 1)]
    for r in range(repeats + 1):
        for m in range(1, k + 2):
            new = ids[r % 8 : r % 8 + m]
            sync()
            t0 = time.perf_counter()
            # The output projection rows a verify always pays (see FIRST_ROWS).
            target.forward(new, capture=capture).rows(0, min(m, FIRST_ROWS))
            sync()
            if r:
                times[m - 1].append(time.perf_counter() - t0)
            target.crop(context_tokens)
    verify = monotone_costs([statistics.median(t) for t in times])
    drafter.begin(ids, step.aux_hidden)
    params = SamplingParams()
    draft = []
    for r in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        drafter.propose(int(ids[-1]), k, params, None)
        sync()
        if r:
            draft.append(time.perf_counter() - t0)
    target.reset()
    if saved_cost is not None:
        drafter.step_cost = saved_cost
    return StepCost(tuple(verify), statistics.median(draft))
