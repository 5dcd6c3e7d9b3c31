"""What a decode step costs on this machine, measured: the tables the draft-length rules of
`dspark.decoding.draft_length` read (`StepCost` for one sequence, `BatchStepCost` for a
batch), timed by running the engines themselves, so the figures hold what drafting,
capture and bookkeeping cost. Call these before decoding: they use the target's cache or
the decoder's slots as scratch.
"""

from __future__ import annotations

import statistics
import time

import torch

from dspark.decoding.batch import BatchedEngine, Sequence
from dspark.decoding.draft_length import BatchStepCost, StepCost
from dspark.decoding.drafters import fork_drafter, model_drafter_of
from dspark.decoding.sampling import SamplingParams
from dspark.decoding.verify import FIRST_ROWS
from dspark.errors import DSparkError


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


class _FixedLength:
    """A draft-length rule that always answers ``k`` (for measuring steps)."""

    k = 0

    def pick(self, b: int) -> int:
        return self.k

    def observe(self, drafted: int, accepted: int) -> None:
        pass


@torch.inference_mode()
def measure_batch_cost(
    decoder, *, max_width: int, drafter=None, capture: tuple[int, ...] = (), context: int = 64, repeats: int = 3
) -> BatchStepCost:
    """Time batched steps for batch sizes 1, 2, 4, ... up to the decoder's slots and widths
    1 .. ``max_width``, over ``context`` cached tokens: without a drafter `SlotDecoder.extend`
    alone; with one, whole `BatchedEngine` steps of sequences drafting ``w - 1`` tokens each
    (forks of ``drafter``, which reads the layers ``capture``), so the figure holds what
    drafting costs. The slots are scratch: call it before serving. The median of ``repeats``
    runs each, made non-decreasing in the width (`monotone_costs`)."""
    batches = sorted({min(decoder.slots, 2**i) for i in range(decoder.slots.bit_length() + 1)})
    widths = tuple(range(1, max_width + 1))
    prompt = [1 + (i % 7) for i in range(context)]

    def timed(run) -> float:
        return median_seconds(run, repeats)

    table = []
    draft_seconds = 0.0
    if drafter is None:
        for slot in range(decoder.slots):
            decoder.prefill(slot, prompt)
        for b in batches:
            row = []
            for w in widths:

                def extend(b=b, w=w) -> None:
                    decoder.extend([[2] * w for _ in range(b)])
                    for slot in range(b):
                        decoder.set_length(slot, context)

                row.append(timed(extend))
            table.append(tuple(monotone_costs(row)))
    else:
        drafter = model_drafter_of(drafter)  # price the model's drafts: drafts without a model cost less
        growth = repeats * sum(widths) + 1  # the most a sequence can advance while measured
        room = decoder.max_len - context - max_width - 1
        if room < growth:
            raise DSparkError(
                f"slots of {decoder.max_len} positions are too short to measure steps (context {context})"
            )
        fixed = _FixedLength()
        engine = BatchedEngine(decoder, capture=capture, draft_length=fixed)
        for b in batches:
            seqs = [
                Sequence(
                    prompt=prompt,
                    max_new_tokens=room,
                    drafter=fork_drafter(drafter),
                    num_speculative_tokens=max_width - 1,
                )
                for _ in range(b)
            ]
            for seq in seqs:
                engine.add(seq)
            row = []
            for w in widths:
                fixed.k = w - 1
                row.append(timed(engine.step))
            for seq in seqs:
                engine.cancel(seq)
            table.append(tuple(monotone_costs(row)))
        probe = fork_drafter(drafter)
        logits, aux = decoder.prefill(0, prompt, capture)
        probe.begin(torch.tensor(prompt), aux if probe.aux_layer_ids else None)
        draft_seconds = timed(lambda: probe.propose(int(logits.argmax()), max_width - 1, SamplingParams(), None))
    decoder.lengths.zero_()
    return BatchStepCost(tuple(batches), widths, tuple(table), draft_seconds)
