"""Many sequences decoding at once, speculatively: one target forward per step verifies every
active sequence's own draft.

`BatchedEngine` keeps each sequence in a slot of a `SlotDecoder` (the target's own modules
over a preallocated KV cache). A step asks each sequence's drafter for its drafts (its own
length, zero included), appends ``[anchor, drafts...]`` to every slot in one forward
(`SlotDecoder.extend`), verifies each sequence against its rows with the same rules as the
one-sequence engine (greedy, or rejection sampling with the sequence's own generator), and
takes back each slot's rejected positions by setting its length. A sequence joins with one
prefill (`add`) and leaves when it stops; the others keep their slots, so continuous
batching is `add` between `step`s. Each sequence has its own drafter instance (drafter state
is per sequence); DSpark/DFlash drafters of one model draft together in one block forward
(`propose_batch`), others one after another.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dspark.decoding.draft_length import LoadAwareDraftLength
from dspark.decoding.drafters import (
    Drafter,
    DSparkDrafter,
    batch_key,
    draft_without_model,
    model_drafter_of,
    propose_batch,
)
from dspark.decoding.engine import GenerationResult
from dspark.decoding.proposal import Proposal
from dspark.decoding.sampling import SamplingParams, probabilities
from dspark.decoding.verify import verify_greedy, verify_sampling
from dspark.errors import DSparkError


@dataclass(eq=False)  # a sequence is itself: two with equal fields are still two requests
class Sequence:
    """One request in the batch: its prompt, limits, sampling state, drafter and output."""

    prompt: list[int]
    max_new_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    generator: torch.Generator | None = None
    stop_ids: set[int] = field(default_factory=set)
    drafter: Drafter | None = None
    num_speculative_tokens: int = 0
    tag: object = None  # the caller's handle (a request id)
    tokens: list[int] = field(default_factory=list)
    forwards: int = 0  # verification forwards (the prefill excluded)
    drafted: int = 0
    accepted: int = 0
    finished: bool = False
    attempts: list[int] = field(default_factory=list)  # per draft slot: reached / accepted
    accepts: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    started: float = 0.0  # perf_counter at the end of the prefill
    ended: float = 0.0

    @property
    def accept_len(self) -> float:
        """Tokens emitted per verification forward, bonus included (as `GenerationResult`)."""
        return (len(self.tokens) - 1) / self.forwards if self.forwards else 0.0

    def result(self) -> GenerationResult:
        """The one-sequence engine's report of this sequence (decode time shared with the batch)."""
        decode = max(0.0, (self.ended or time.perf_counter()) - self.started)
        decoded = len(self.tokens) - 1
        return GenerationResult(
            tokens=list(self.tokens),
            accept_len=self.accept_len,
            per_position_acceptance=[a / n if n else None for a, n in zip(self.accepts, self.attempts, strict=True)],
            tokens_per_second=decoded / decode if decode > 0 and decoded else 0.0,
            target_forwards=self.forwards,
            prefill_seconds=self.prefill_seconds,
            decode_seconds=decode,
            prompt_tokens=len(self.prompt),
            drafted_tokens=self.drafted,
            position_attempts=list(self.attempts),
            position_accepts=list(self.accepts),
            lookup_steps=getattr(self.drafter, "lookup_steps", None),
        )


class BatchedEngine:
    """Continuous batching with speculative decoding over a `SlotDecoder` of ``slots`` rows."""

    def __init__(
        self,
        decoder,
        capture: tuple[int, ...] = (),
        draft_length: LoadAwareDraftLength | None = None,
        *,
        draft_together: bool = True,
    ) -> None:
        self.decoder = decoder
        self.draft_together = draft_together  # False: every drafter proposes alone (for A/B runs)
        self.capture = tuple(capture)  # the aux layers every drafter of this engine reads
        self.active: list[Sequence] = []  # sequence i lives in slot i
        self.draft_length = draft_length  # None: each sequence drafts its num_speculative_tokens
        self.last_step = (0, 0)
        self.last_rule: tuple[int, float] | None = None  # (length the load-aware rule picked, step seconds)

    @property
    def free_slots(self) -> int:
        return self.decoder.slots - len(self.active)

    def _pick(self, logits: torch.Tensor, seq: Sequence) -> int:
        if seq.params.greedy:
            return int(torch.argmax(logits))
        return int(torch.multinomial(probabilities(logits[None], seq.params)[0], 1, generator=seq.generator))

    @torch.inference_mode()
    def add(self, seq: Sequence) -> list[int]:
        """Prefill ``seq`` into a free slot; the token(s) it emitted (its first)."""
        if not self.free_slots:
            raise DSparkError("no free slot: step until a sequence finishes")
        if seq.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if len(seq.prompt) + seq.max_new_tokens + seq.num_speculative_tokens + 1 > self.decoder.max_len:
            raise DSparkError(
                f"a prompt of {len(seq.prompt)} tokens + {seq.max_new_tokens} new does not fit a slot of "
                f"{self.decoder.max_len} positions"
            )
        wanted = tuple(seq.drafter.aux_layer_ids) if seq.drafter is not None else ()
        if any(i not in self.capture for i in wanted):
            raise DSparkError(f"the drafter reads layers {list(wanted)}; this engine captures {list(self.capture)}")
        slot = len(self.active)
        seq.attempts = [0] * seq.num_speculative_tokens
        seq.accepts = [0] * seq.num_speculative_tokens
        t0 = time.perf_counter()
        if self.capture:
            logits, aux = self.decoder.prefill(slot, seq.prompt, self.capture)
        else:
            logits, aux = self.decoder.prefill(slot, seq.prompt), None
        first = self._pick(logits, seq)
        seq.tokens = [first]
        seq.started = time.perf_counter()
        seq.prefill_seconds = seq.started - t0
        if seq.drafter is not None:
            seq.drafter.begin(torch.tensor(seq.prompt), self._columns(aux, seq))
        self.active.append(seq)
        if first in seq.stop_ids or seq.max_new_tokens == 1:
            self._finish(slot)
        return [first]

    def _columns(self, aux: torch.Tensor | None, seq: Sequence) -> torch.Tensor | None:
        """The slice of the captured states that ``seq``'s drafter reads, in its order."""
        if aux is None or seq.drafter is None or not seq.drafter.aux_layer_ids:
            return None
        if tuple(seq.drafter.aux_layer_ids) == self.capture:  # the usual case: every drafter reads them all
            return aux
        h = aux.shape[-1] // len(self.capture)
        return torch.cat(
            [aux[:, self.capture.index(i) * h : (self.capture.index(i) + 1) * h] for i in seq.drafter.aux_layer_ids], -1
        )

    def _finish(self, slot: int) -> None:
        """Drop the sequence in ``slot``; the last one moves into its place."""
        self.active[slot].finished = True
        self.active[slot].ended = time.perf_counter()
        last = len(self.active) - 1
        if slot != last:
            self.decoder.move(last, slot)
            self.active[slot] = self.active[last]
        self.active.pop()

    @torch.inference_mode()
    def step(self) -> list[tuple[Sequence, list[int]]]:
        """One forward for every active sequence: ``(sequence, tokens it emitted)`` each;
        finished sequences have left the batch when it returns."""
        self.last_rule = None
        if not self.active:
            return []
        rows: list[list[int]] = []
        drafting = [s for s in self.active if s.drafter is not None and s.num_speculative_tokens]
        # A sequence alone in the batch drafts as the one-sequence engine does with a cost
        # model: its drafter's confidence head stops the draft slot by slot, priced by the
        # batch table's one-sequence row (`LoadAwareDraftLength.solo_cost`).
        solo = self._solo_drafter() if len(self.active) == 1 and drafting else None
        started = time.perf_counter()
        cap = None
        if self.draft_length is not None and drafting and solo is None:
            cap = self.draft_length.pick(len(self.active))
        # A rule that sets the width from the drafts' own confidences (`LoadAwareDraftLength.width`)
        # trims the ``cap`` drafts each sequence made to a width of at most ``cap``: the step
        # costs what the rule priced (drafting ``cap`` slots) or less.
        trim = bool(cap) and isinstance(self.draft_length, LoadAwareDraftLength) and len(self.active) > 1
        ks = []
        proposals = [Proposal.empty() for _ in self.active]
        drafters: dict[int, Drafter] = {}  # who drafts for sequence i this step
        groups: dict[object, list[int]] = {}  # drafters that draft in one forward, by batch_key
        for i, seq in enumerate(self.active):
            k = min(seq.num_speculative_tokens, seq.max_new_tokens - len(seq.tokens) - 1)
            if cap is not None:
                k = min(k, cap)
            ks.append(k if seq.drafter is not None else 0)
            if ks[-1] <= 0:
                continue
            found = draft_without_model(seq.drafter, seq.tokens[-1], ks[-1], seq.params, seq.generator)
            if found is not None:  # e.g. a prompt lookup hit: drafted for free
                proposals[i] = found
                continue
            drafter = drafters[i] = model_drafter_of(seq.drafter)
            key = batch_key(drafter) if self.draft_together else None
            groups.setdefault(("alone", i) if key is None else key, []).append(i)
        for members in groups.values():
            seqs = [self.active[i] for i in members]
            if len(members) == 1:
                i, seq = members[0], seqs[0]
                args = (seq.tokens[-1], ks[i], seq.params, seq.generator)
                if solo is not None:
                    proposals[i] = solo.propose(*args, step_cost=self.draft_length.solo_cost())
                else:
                    proposals[i] = drafters[i].propose(*args)
                continue
            drafted = propose_batch(
                [drafters[i] for i in members],
                [s.tokens[-1] for s in seqs],
                [ks[i] for i in members],
                [s.params for s in seqs],
                [s.generator for s in seqs],
            )
            for i, proposal in zip(members, drafted, strict=True):
                proposals[i] = proposal
        if trim:
            width = self.draft_length.width(proposals, len(self.active))
            proposals = [p.head(width) for p in proposals]
        for seq, proposal in zip(self.active, proposals, strict=True):
            rows.append([seq.tokens[-1], *proposal.tokens.tolist()])
        self.last_step = (len(self.active), sum(len(p) for p in proposals))  # (batch, drafts) for metrics
        lengths = self.decoder.lengths[: len(self.active)].clone()
        outputs = self.decoder.extend(rows, self.capture)
        emitted: list[tuple[Sequence, list[int]]] = []
        done: list[int] = []
        for slot, (seq, proposal, ids, (logits, aux)) in enumerate(
            zip(self.active, proposals, rows, outputs, strict=True)
        ):
            drafts = proposal.tokens
            if seq.params.greedy:
                verdict = verify_greedy(drafts, logits)
            else:
                q = proposal.probs if len(drafts) else torch.zeros(0, logits.shape[-1])
                verdict = verify_sampling(drafts, q, probabilities(logits, seq.params), seq.generator)
            a = verdict.num_accepted
            self.decoder.set_length(slot, int(lengths[slot]) + a + 1)
            seq.forwards += 1
            seq.drafted += len(drafts)
            seq.accepted += a
            for j in range(min(len(drafts), a + 1)):
                seq.attempts[j] += 1
                seq.accepts[j] += int(j < a)
            if self.draft_length is not None and len(drafts) and solo is None:
                # (A confidence-cut draft reaches the easy slots only: it would bias the
                # batch rule's acceptance rates upward.)
                self.draft_length.observe(len(drafts), a)
            if seq.drafter is not None:
                seq.drafter.accept(
                    torch.tensor(ids[: a + 1]), None if aux is None else self._columns(aux[: a + 1], seq)
                )
            new = []
            for tok in verdict.tokens:
                seq.tokens.append(tok)
                new.append(tok)
                if tok in seq.stop_ids or len(seq.tokens) >= seq.max_new_tokens:
                    done.append(slot)
                    break
            emitted.append((seq, new))
        if cap is not None and isinstance(self.draft_length, LoadAwareDraftLength):
            # What the rule's choice cost this time corrects its start-up table (`observe_step`).
            self.last_rule = (cap, time.perf_counter() - started)
            self.draft_length.observe_step(len(rows), *self.last_rule)
        for slot in sorted(done, reverse=True):
            self._finish(slot)
        return emitted

    def _solo_drafter(self):
        """The model drafter of the batch's one sequence when the confidence rule applies to
        it: a load-aware engine, a DSpark drafter with a confidence head and no rule of its own."""
        seq = self.active[0]
        if not isinstance(self.draft_length, LoadAwareDraftLength) or seq.drafter is None:
            return None
        drafter = model_drafter_of(seq.drafter)
        if type(drafter) is not DSparkDrafter or drafter.model.confidence_head is None:
            return None
        if drafter.confidence_threshold is not None or drafter.step_cost is not None:
            return None
        return drafter

    def cancel(self, seq: Sequence) -> None:
        """Take ``seq`` out of the batch now (a client that went away)."""
        self._finish(next(i for i, s in enumerate(self.active) if s is seq))

    def run(self, sequences: list[Sequence], on_tokens: Callable[[Sequence, list[int]], None] | None = None):
        """Decode every sequence to its end, admitting new ones as slots free up; returns them."""
        queue = list(sequences)
        queue.reverse()
        while queue or self.active:
            while queue and self.free_slots:
                seq = queue.pop()
                first = self.add(seq)
                if on_tokens:
                    on_tokens(seq, first)
            for seq, new in self.step():
                if on_tokens:
                    on_tokens(seq, new)
        return sequences
