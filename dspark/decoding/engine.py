"""One engine for every method: propose -> verify -> accept, with the metrics of DESIGN §6.

Plain decoding is the same loop with no drafter (zero drafts per step), so baseline,
n-gram and DSpark are timed and counted by exactly the same code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from dspark.decoding.drafters import Drafter
from dspark.decoding.proposal import Proposal
from dspark.decoding.sampling import SamplingParams, probabilities
from dspark.decoding.verify import verify_greedy_rows, verify_sampling_rows
from dspark.target.adapter import TargetModel


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids (prompt excluded)
    accept_len: float  # tokens emitted per target verification forward, bonus included
    per_position_acceptance: list[float | None]  # P(slot k accepted | slots < k accepted)
    tokens_per_second: float  # decode-loop tokens / decode wall time (prefill excluded)
    target_forwards: int  # verification forwards (prefill excluded)
    prefill_seconds: float
    decode_seconds: float
    prompt_tokens: int
    drafted_tokens: int = 0  # draft tokens sent to verification
    # Decode-loop wall time by stage: propose (drafting), target (verification forward),
    # verify (acceptance rule), bookkeeping (cache crop, drafter update, appends).
    timings: dict[str, float] = field(default_factory=dict)
    position_attempts: list[int] = field(default_factory=list)
    position_accepts: list[int] = field(default_factory=list)
    # (slot k, confidence c_k, accepted) for every slot verification reached (earlier slots
    # accepted), when the drafter has a confidence head: the data of its calibration.
    confidence_records: list[tuple[int, float, bool]] = field(default_factory=list)
    # Steps drafted by prompt lookup (a LookupFirstDrafter); None for other drafters.
    lookup_steps: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)


class SpeculativeEngine:
    """Speculative decoding of one sequence at a time with any `Drafter` (or none)."""

    def __init__(self, target: TargetModel, drafter: Drafter | None = None, *, num_speculative_tokens: int = 0) -> None:
        if num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}")
        if drafter is None and num_speculative_tokens:
            raise ValueError("num_speculative_tokens > 0 needs a drafter")
        if drafter is not None and num_speculative_tokens > drafter.max_draft_tokens:
            raise ValueError(
                f"num_speculative_tokens={num_speculative_tokens} exceeds what the {drafter.name} "
                f"drafter proposes per step ({drafter.max_draft_tokens})"
            )
        self.target = target
        self.drafter = drafter
        self.k = num_speculative_tokens

    def _pick(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
        if params.greedy:
            return int(torch.argmax(logits))
        return int(torch.multinomial(probabilities(logits, params), 1, generator=generator).item())

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: torch.Tensor | list[int],
        *,
        max_new_tokens: int = 128,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        stop_token_ids: set[int] | None = None,
        on_tokens: Callable[[list[int]], bool] | None = None,
    ) -> GenerationResult:
        """Decode up to ``max_new_tokens`` tokens (stopping after a stop token).

        ``on_tokens(new_ids)`` is called with the tokens each step emits (the prefill's first
        token included); returning True ends generation there (a stop string, a client that
        went away). Output up to that point is unaffected: the callback only cuts it short."""
        params = params or SamplingParams()
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        target, drafter = self.target, self.drafter
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long).view(-1)
        if prompt.numel() == 0:
            raise ValueError("the prompt is empty")
        if int(prompt.max()) >= target.vocab_size or int(prompt.min()) < 0:
            raise ValueError(f"prompt token ids must lie in [0, {target.vocab_size})")
        stops = target.stop_token_ids() if stop_token_ids is None else set(stop_token_ids)
        capture = tuple(drafter.aux_layer_ids) if drafter is not None else ()
        device = target.device

        _sync(device)
        t0 = time.perf_counter()
        target.reset()
        step = target.forward(prompt, capture=capture)
        generated = [self._pick(step.rows(-1)[0], params, generator)]
        if drafter is not None:
            drafter.begin(prompt, step.aux_hidden)
        lookups_before = getattr(drafter, "lookup_steps", None)
        _sync(device)
        t1 = time.perf_counter()
        halted = on_tokens is not None and bool(on_tokens(list(generated)))

        attempts = [0] * self.k
        accepts = [0] * self.k
        forwards = 0
        decoded = 0
        drafted = 0
        records: list[tuple[int, float, bool]] = []
        timings = dict.fromkeys(("propose", "target", "verify", "bookkeeping"), 0.0)
        clock = time.perf_counter
        while not halted and len(generated) < max_new_tokens and generated[-1] not in stops:
            anchor = generated[-1]
            remaining = max_new_tokens - len(generated)
            k = min(self.k, remaining - 1)
            c0 = clock()
            proposal = drafter.propose(anchor, k, params, generator) if (drafter and k > 0) else Proposal.empty()
            drafts = proposal.tokens.to(device)
            c1 = clock()
            n = drafts.shape[0]
            drafted += n
            verify_ids = torch.cat([torch.tensor([anchor], device=device), drafts])
            cached = target.cache_len
            step = target.forward(verify_ids, capture=capture)
            forwards += 1
            c2 = clock()
            if params.greedy:
                verdict = verify_greedy_rows(drafts, step.rows)
            else:
                draft_probs = proposal.probs if n else torch.zeros(0, target.vocab_size)
                verdict = verify_sampling_rows(
                    drafts,
                    draft_probs.to(device),
                    lambda a, b, step=step: probabilities(step.rows(a, b), params),
                    generator,
                )
            a = verdict.num_accepted
            c3 = clock()
            for j in range(min(n, a + 1)):
                attempts[j] += 1
                accepts[j] += int(j < a)
            if proposal.confidence is not None:
                conf = proposal.confidence.tolist()
                records.extend((j, conf[j], j < a) for j in range(min(n, a + 1)))
            target.crop(cached + a + 1)
            if drafter is not None:
                drafter.accept(verify_ids[: a + 1], None if step.aux_hidden is None else step.aux_hidden[: a + 1])
            new = []
            for tok in verdict.tokens:
                generated.append(tok)
                new.append(tok)
                decoded += 1
                if tok in stops or len(generated) >= max_new_tokens:
                    break
            if on_tokens is not None:
                halted = bool(on_tokens(new))
            c4 = clock()
            timings["propose"] += c1 - c0
            timings["target"] += c2 - c1
            timings["verify"] += c3 - c2
            timings["bookkeeping"] += c4 - c3
        _sync(device)
        t2 = time.perf_counter()
        decode_s = t2 - t1
        return GenerationResult(
            tokens=generated,
            accept_len=decoded / forwards if forwards else 0.0,
            per_position_acceptance=[acc / att if att else None for acc, att in zip(accepts, attempts, strict=True)],
            tokens_per_second=decoded / decode_s if decode_s > 0 and decoded else 0.0,
            target_forwards=forwards,
            prefill_seconds=t1 - t0,
            decode_seconds=decode_s,
            prompt_tokens=int(prompt.numel()),
            drafted_tokens=drafted,
            timings=timings,
            position_attempts=attempts,
            position_accepts=accepts,
            confidence_records=records,
            lookup_steps=None if lookups_before is None else drafter.lookup_steps - lookups_before,
        )
