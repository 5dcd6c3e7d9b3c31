"""The drafter interface the engine speaks, and the drafters that implement it.

A drafter keeps its own view of the verified context. The engine calls
``begin(prompt)`` once, then per step ``propose(anchor, k)`` (anchor = the last
verified token, not yet seen by the target) and ``accept(tokens, aux)`` with the
tokens the target verified this step (anchor first) and their target hidden states.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from dspark.decoding.draft_length import StepCost
from dspark.decoding.proposal import Proposal
from dspark.decoding.sampling import SamplingParams, probabilities
from dspark.model.dspark import DSparkDraftModel


class Drafter(Protocol):
    name: str
    aux_layer_ids: tuple[int, ...]  # target layers the engine captures for it (empty: none)

    @property
    def max_draft_tokens(self) -> int: ...

    def begin(self, prompt_ids: torch.Tensor, prompt_aux: torch.Tensor | None) -> None: ...

    def propose(self, anchor: int, k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal: ...

    def accept(self, token_ids: torch.Tensor, aux: torch.Tensor | None) -> None: ...


def point_mass(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[k] ids -> [k, V] one-hot distributions (a deterministic drafter's q)."""
    probs = torch.zeros(tokens.shape[0], vocab_size, device=tokens.device)
    probs[torch.arange(tokens.shape[0], device=tokens.device), tokens] = 1.0
    return probs


class NgramDrafter:
    """Prompt lookup: continue the most recent earlier match of the last n tokens.

    Tries n = ``max_ngram`` down to ``min_ngram`` (the anchor is the n-gram's last token) and
    drafts what followed the most recent earlier occurrence. An index from every n-gram of
    the verified text to its latest start keeps a lookup O(1) in the context length.
    """

    aux_layer_ids = ()

    def __init__(self, vocab_size: int, *, max_ngram: int = 3, min_ngram: int = 1, max_draft: int = 16) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.name = "ngram"
        self.vocab_size = vocab_size
        self.max_ngram, self.min_ngram, self._max_draft = max_ngram, min_ngram, max_draft
        self.history: list[int] = []
        self._latest: dict[int, dict[tuple[int, ...], int]] = {}

    @property
    def max_draft_tokens(self) -> int:
        return self._max_draft

    def begin(self, prompt_ids: torch.Tensor, prompt_aux: torch.Tensor | None) -> None:
        self.history = []
        self._latest = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self._extend(prompt_ids.tolist())

    def _extend(self, tokens: list[int]) -> None:
        history = self.history
        for tok in tokens:
            history.append(int(tok))
            end = len(history)
            for n, latest in self._latest.items():
                if end >= n:
                    latest[tuple(history[end - n : end])] = end - n

    def _lookup(self, anchor: int, k: int) -> list[int]:
        history = self.history
        for n in range(min(self.max_ngram, len(history)), self.min_ngram - 1, -1):
            start = self._latest[n].get((*history[len(history) - n + 1 :], anchor))
            if start is not None:
                found = history[start + n : start + n + k]
                if len(found) < k:  # the match ends right before the anchor: it comes next
                    found.append(anchor)
                return found
        return []

    def propose(self, anchor: int, k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        found = self._lookup(int(anchor), k) if k > 0 else []
        tokens = torch.tensor(found, dtype=torch.long)
        probs = None if params.greedy else point_mass(tokens, self.vocab_size)
        return Proposal(tokens=tokens, probs=probs)

    def accept(self, token_ids: torch.Tensor, aux: torch.Tensor | None) -> None:
        self._extend(token_ids.tolist())


class LookupFirstDrafter:
    """Prompt lookup first, the model drafter otherwise: when the last ``min_ngram`` tokens
    (anchor included) occurred earlier in the prompt or output, the step drafts their most
    recent continuation (`NgramDrafter`, longest match first, up to max(3, min_ngram) tokens); otherwise the
    wrapped model drafter drafts, with its own draft-length rule. The model drafter sees every
    verified token either way, so its context stays complete. Lossless like any drafter: the
    lookup's tokens are verified like the model's (point masses under sampling)."""

    def __init__(self, model_drafter, vocab_size: int, *, min_ngram: int = 3) -> None:
        if min_ngram < 1:
            raise ValueError(f"prompt lookup needs an n-gram length >= 1, got {min_ngram}")
        self.model_drafter = model_drafter
        self.lookup = NgramDrafter(
            vocab_size, min_ngram=min_ngram, max_ngram=max(min_ngram, 3), max_draft=model_drafter.max_draft_tokens
        )
        self.name = f"{model_drafter.name}+ngram"
        self.aux_layer_ids = model_drafter.aux_layer_ids
        self.lookup_steps = 0  # steps drafted by the lookup / by the model (for reports)
        self.model_steps = 0
        self._lookup_seconds = 0.0

    @property
    def config(self):
        return self.model_drafter.config

    @property
    def max_draft_tokens(self) -> int:
        return self.model_drafter.max_draft_tokens

    @property
    def step_cost(self) -> StepCost | None:
        return getattr(self.model_drafter, "step_cost", None)

    @property
    def timings(self) -> dict[str, float]:
        return {**getattr(self.model_drafter, "timings", {}), "lookup": self._lookup_seconds}

    def begin(self, prompt_ids: torch.Tensor, prompt_aux: torch.Tensor | None) -> None:
        self.model_drafter.begin(prompt_ids, prompt_aux)
        self.lookup.begin(prompt_ids, None)

    def lookup_first(
        self, anchor: int, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal | None:
        """The lookup's drafts, or None when the model drafter drafts this step (counted as
        such: the caller asks it, alone or in a batch)."""
        t0 = time.perf_counter()
        found = self.lookup.propose(anchor, k, params, generator)
        self._lookup_seconds += time.perf_counter() - t0
        if len(found):
            self.lookup_steps += 1
            return found
        self.model_steps += 1
        return None

    def propose(self, anchor: int, k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        found = self.lookup_first(anchor, k, params, generator)
        return found if found is not None else self.model_drafter.propose(anchor, k, params, generator)

    def accept(self, token_ids: torch.Tensor, aux: torch.Tensor | None) -> None:
        self.model_drafter.accept(token_ids, aux)
        self.lookup.accept(token_ids, None)


class DSparkDrafter:
    """Block-parallel drafting with a DSpark (or DFlash) model and its own context KV cache.

    The context cache holds per-layer keys/values of the projected target features of
    verified tokens only; it grows in `accept` and is never rolled back.
    """

    def __init__(
        self,
        model: DSparkDraftModel,
        *,
        target_vocab_size: int,
        confidence_threshold: float | None = None,
        step_cost: StepCost | None = None,
    ) -> None:
        if confidence_threshold is not None and not 0.0 <= confidence_threshold <= 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1], got {confidence_threshold}")
        if confidence_threshold is not None and model.confidence_head is None:
            raise ValueError("confidence_threshold needs a drafter with a confidence head")
        self.model = model.eval()
        self.config = model.config
        self.name = self.config.method
        self.aux_layer_ids = tuple(self.config.aux_hidden_state_layer_ids)
        self.target_vocab_size = target_vocab_size
        self.confidence_threshold = confidence_threshold
        self._step_cost = None
        self.step_cost = step_cost  # cost-model draft length (dspark.decoding.draft_length)
        self._draft_to_target = model.draft_to_target
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._ctx_len = 0
        self._pending: list[torch.Tensor] = []  # accepted rows not yet in the context cache
        # Cumulative wall time of drafting stages, for profiles (CPU timings; not synchronised on CUDA).
        self.timings = {"context": 0.0, "backbone": 0.0, "heads": 0.0}

    @property
    def max_draft_tokens(self) -> int:
        return self.config.drafts_per_block

    @property
    def step_cost(self) -> StepCost | None:
        return self._step_cost

    @step_cost.setter
    def step_cost(self, cost: StepCost | None) -> None:
        if cost is not None and self.model.confidence_head is None:
            raise ValueError("a cost-model draft length needs a drafter with a confidence head")
        if cost is not None and self.confidence_threshold is not None:
            raise ValueError("choose one draft-length rule, a confidence threshold or a cost model, not both")
        self._step_cost = cost

    @property
    def device(self) -> torch.device:
        return self.model.fc.weight.device

    @torch.inference_mode()
    def _extend(self, aux: torch.Tensor) -> None:
        t0 = time.perf_counter()
        n = aux.shape[0]
        positions = torch.arange(self._ctx_len, self._ctx_len + n, device=self.device)
        ctx = self.model.project_context(aux.to(self.device).unsqueeze(0))
        new = self.model.context_kv(ctx, positions)
        if self._kv:
            self._kv = [
                (torch.cat([k0, k1], dim=2), torch.cat([v0, v1], dim=2))
                for (k0, v0), (k1, v1) in zip(self._kv, new, strict=True)
            ]
        else:
            self._kv = new
        self._ctx_len += n
        self.timings["context"] += time.perf_counter() - t0

    def begin(self, prompt_ids: torch.Tensor, prompt_aux: torch.Tensor | None) -> None:
        if prompt_aux is None:
            raise ValueError("DSparkDrafter needs the target's aux hidden states")
        # The prompt joins the context at the first drafting step, with what is accepted
        # before it: a sequence that never drafts (a batch under load) costs nothing here.
        self._kv, self._ctx_len, self._pending = [], 0, [prompt_aux]

    def accept(self, token_ids: torch.Tensor, aux: torch.Tensor | None) -> None:
        """Verified tokens' states join the context at the next drafting step (in one call):
        steps that do not draft (a draft-length rule chose zero) cost nothing here."""
        if aux is None or aux.shape[0] != token_ids.shape[0]:
            raise ValueError("accept() needs one aux hidden row per accepted token")
        self._pending.append(aux)

    @torch.inference_mode()
    def propose(
        self,
        anchor: int,
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        *,
        step_cost: StepCost | None = None,
    ) -> Proposal:
        """``step_cost``: price this step's draft by it instead of the drafter's own rule (the
        batched engine's one-sequence row for a sequence alone in its batch)."""
        cfg, model = self.config, self.model
        k = min(k, cfg.drafts_per_block)
        if k <= 0:
            return Proposal.empty(self.device)
        if self._pending:
            self._extend(torch.cat(self._pending) if len(self._pending) > 1 else self._pending[0])
            self._pending = []
        t0 = time.perf_counter()
        p = self._ctx_len  # the anchor's absolute position
        block = model.block_input_ids(torch.tensor([anchor], device=self.device))
        positions = torch.arange(p, p + cfg.block_size, device=self.device)
        hidden = model.backbone(block, positions, self._kv)[0]  # [B, H]
        first = 0 if cfg.sample_from_anchor else 1  # slot that yields draft 0
        slot_hidden = hidden[first : first + k]
        base = model.base_logits(slot_hidden)  # [k, V_d] fp32
        t1 = time.perf_counter()
        tokens: list[int] = []
        draft_rows: list[torch.Tensor] = []
        conf: list[torch.Tensor] = []
        survival, expected = 1.0, 1.0
        cost = self._step_cost if step_cost is None else step_cost
        prev = int(anchor)
        state = None
        for j in range(k):
            prev_ids = torch.tensor([prev], device=self.device)
            prev_emb = model.prev_embedding(prev_ids)
            logits = base[j]
            if model.markov_head is not None:
                bias, state = model.markov_head.step(prev_emb[0], slot_hidden[j], state)
                logits = logits + bias.float()
            if model.confidence_head is not None:
                c = torch.sigmoid(model.confidence_logit(slot_hidden[j], None if prev_emb is None else prev_emb[0]))
                # Early stops: both rules see only this slot's confidence and earlier ones.
                if cost is not None:
                    if not cost.include(expected, survival * float(c), float(c), j, k):
                        break
                    survival *= float(c)
                    expected += survival
                elif self.confidence_threshold is not None:
                    survival *= float(c)
                    if survival < self.confidence_threshold:
                        break
                conf.append(c)
            if params.greedy:
                draft_id = int(torch.argmax(logits))
            else:
                q = probabilities(logits, params)
                draft_id = int(torch.multinomial(q, 1, generator=generator).item())
                draft_rows.append(q)
            prev = int(self._draft_to_target[draft_id])
            tokens.append(prev)
        out = torch.tensor(tokens, dtype=torch.long, device=self.device)
        probs = None
        if not params.greedy:
            probs = torch.zeros(len(tokens), self.target_vocab_size, device=self.device)
            if tokens:
                probs[:, self._draft_to_target] = torch.stack(draft_rows)
        confidence = torch.stack(conf).reshape(-1)[: len(tokens)] if conf else None
        self.timings["backbone"] += t1 - t0
        self.timings["heads"] += time.perf_counter() - t1
        return Proposal(tokens=out, probs=probs, confidence=confidence)


def model_drafter_of(drafter):
    """The drafter whose model drafts: a wrapper's ``model_drafter`` (one that drafts some
    steps without a model, like `LookupFirstDrafter`), else the drafter itself."""
    return getattr(drafter, "model_drafter", drafter)


def draft_without_model(drafter, anchor: int, k: int, params: SamplingParams, generator) -> Proposal | None:
    """A step's drafts made without a model forward (a wrapper's ``lookup_first``: a prompt
    lookup hit), or None: `model_drafter_of(drafter)` drafts this step, alone or in a batch."""
    first = getattr(drafter, "lookup_first", None)
    return None if first is None else first(anchor, k, params, generator)


def batch_key(drafter) -> object | None:
    """Drafters with equal keys draft together in one block forward (`propose_batch`): DSpark
    and DFlash drafters of one model whose draft length no per-sequence rule cuts short
    (a batch's length comes from its own rule). None: the drafter drafts alone."""
    if type(drafter) is DSparkDrafter and drafter.confidence_threshold is None and drafter.step_cost is None:
        return id(drafter.model)
    return None


@torch.inference_mode()
def propose_batch(
    drafters: list[DSparkDrafter],
    anchors: list[int],
    ks: list[int],
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[Proposal]:
    """`DSparkDrafter.propose` for several sequences of one model at once: their pending
    context rows in one projection, their blocks in one backbone forward (each over its own
    context, padded and masked, at its own positions), the heads a slot at a time for all.
    Each sequence keeps its own length, sampling parameters and generator; the drafts equal
    its `propose`'s up to float rounding."""
    lead = drafters[0]
    model, cfg, device = lead.model, lead.config, lead.device
    ks = [max(0, min(k, cfg.drafts_per_block)) for k in ks]
    live = [i for i, k in enumerate(ks) if k]
    if len(live) < len(ks):  # a sequence drafting nothing does no work (as `propose` with k = 0)
        out = [Proposal.empty(device) for _ in ks]
        if live:
            drafted = propose_batch(
                [drafters[i] for i in live],
                [anchors[i] for i in live],
                [ks[i] for i in live],
                [params[i] for i in live],
                [generators[i] for i in live],
            )
            for i, proposal in zip(live, drafted, strict=True):
                out[i] = proposal
        return out
    t0 = time.perf_counter()
    waiting = [(d, torch.cat(d._pending) if len(d._pending) > 1 else d._pending[0]) for d in drafters if d._pending]
    if waiting:
        rows = torch.cat([a for _, a in waiting]).to(device)
        positions = torch.cat([torch.arange(d._ctx_len, d._ctx_len + a.shape[0], device=device) for d, a in waiting])
        new = model.context_kv(model.project_context(rows[None]), positions)
        start = 0
        for d, a in waiting:
            n = a.shape[0]
            piece = [(k[:, :, start : start + n], v[:, :, start : start + n]) for k, v in new]
            d._kv = (
                [
                    (torch.cat([k0, k1], dim=2), torch.cat([v0, v1], dim=2))
                    for (k0, v0), (k1, v1) in zip(d._kv, piece, strict=True)
                ]
                if d._kv
                else piece
            )
            d._ctx_len += n
            d._pending = []
            start += n
    t1 = time.perf_counter()
    b, n = len(drafters), cfg.block_size
    lengths = [d._ctx_len for d in drafters]
    span = max(lengths)
    ctx_kv = []
    for layer in range(len(model.layers)):
        k0, v0 = lead._kv[layer]
        keys = k0.new_zeros((b, k0.shape[1], span, k0.shape[3]))
        values = v0.new_zeros((b, v0.shape[1], span, v0.shape[3]))
        for i, (d, length) in enumerate(zip(drafters, lengths, strict=True)):
            keys[i, :, :length] = d._kv[layer][0][0]
            values[i, :, :length] = d._kv[layer][1][0]
        ctx_kv.append((keys, values))
    mask = torch.ones(b, 1, n, span + n, dtype=torch.bool, device=device)
    for i, length in enumerate(lengths):
        mask[i, :, :, length:span] = False  # padding after a shorter context
    positions = torch.tensor(lengths, device=device)[:, None] + torch.arange(n, device=device)[None]
    block = model.block_input_ids(torch.tensor(anchors, device=device))
    hidden = model.backbone(block, positions, ctx_kv, mask)  # [b, N, H]
    first = 0 if cfg.sample_from_anchor else 1
    kmax = max(ks)
    slot_hidden = hidden[:, first : first + kmax]
    base = model.base_logits(slot_hidden)  # [b, kmax, V_d] fp32
    t2 = time.perf_counter()
    tokens: list[list[int]] = [[] for _ in drafters]
    draft_rows: list[list[torch.Tensor]] = [[] for _ in drafters]
    conf: list[list[torch.Tensor]] = [[] for _ in drafters]
    prev = torch.tensor(anchors, device=device)
    state = None
    for j in range(kmax):
        prev_emb = model.prev_embedding(prev)
        logits = base[:, j]
        if model.markov_head is not None:
            bias, state = model.markov_head.step(prev_emb, slot_hidden[:, j], state)
            logits = logits + bias.float()
        c = None
        if model.confidence_head is not None:
            c = torch.sigmoid(model.confidence_logit(slot_hidden[:, j], prev_emb))
        greedy = logits.argmax(-1).tolist()
        nxt = prev.tolist()
        for i in range(b):
            if j >= ks[i]:
                continue
            if params[i].greedy:
                draft_id = greedy[i]
            else:
                q = probabilities(logits[i], params[i])
                draft_id = int(torch.multinomial(q, 1, generator=generators[i]).item())
                draft_rows[i].append(q)
            nxt[i] = int(lead._draft_to_target[draft_id])
            tokens[i].append(nxt[i])
            if c is not None:
                conf[i].append(c[i])
        prev = torch.tensor(nxt, device=device)
    out = []
    for i, d in enumerate(drafters):
        probs = None
        if not params[i].greedy:
            probs = torch.zeros(len(tokens[i]), d.target_vocab_size, device=device)
            if tokens[i]:
                probs[:, d._draft_to_target] = torch.stack(draft_rows[i])
        confidence = torch.stack(conf[i]) if conf[i] else None
        out.append(Proposal(torch.tensor(tokens[i], dtype=torch.long, device=device), probs, confidence))
    t3 = time.perf_counter()
    for d in drafters:  # the batch's time, shared out
        d.timings["context"] += (t1 - t0) / b
        d.timings["backbone"] += (t2 - t1) / b
        d.timings["heads"] += (t3 - t2) / b
    return out


class Eagle3Drafter:
    """Chain drafting with an EAGLE-3 model: one layer forward per drafted token.

    Its cache holds the layer's keys/values of real pairs (target feature of t-1, token t)
    only; the feature of the last verified token waits (``pending``) until its next token,
    the anchor, is known. Drafted steps are never cached: they are recomputed per step.
    """

    name = "eagle3"

    def __init__(self, model, *, target_vocab_size: int) -> None:
        self.model = model.eval()
        self.config = model.config
        self.aux_layer_ids = tuple(self.config.aux_hidden_state_layer_ids)
        self.target_vocab_size = target_vocab_size
        self._draft_to_target = model.draft_to_target
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._pending: torch.Tensor | None = None
        self._queued: list[tuple[torch.Tensor, torch.Tensor]] = []  # verified pairs not yet cached
        self._next_pos = 0  # absolute position of the next token to pair
        self.timings = {"context": 0.0, "backbone": 0.0, "heads": 0.0}

    @property
    def max_draft_tokens(self) -> int:
        return self.config.speculative_steps

    @property
    def device(self) -> torch.device:
        return self.model.fc.weight.device

    @torch.inference_mode()
    def _add_pairs(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        """Cache real pairs (features[i], tokens[i]) at positions next_pos.. ."""
        t0 = time.perf_counter()
        n = tokens.shape[0]
        if n:
            model, layer = self.model, self.model.layer
            positions = torch.arange(self._next_pos, self._next_pos + n, device=self.device)
            x = layer.attn_input(model.embed(tokens.to(self.device)), model.project(features.to(self.device)))
            _, k, v = layer.self_attn.qkv(x, positions)
            self._k = k if self._k is None else torch.cat([self._k, k], dim=1)
            self._v = v if self._v is None else torch.cat([self._v, v], dim=1)
        self._next_pos += n
        self.timings["context"] += time.perf_counter() - t0

    def begin(self, prompt_ids: torch.Tensor, prompt_aux: torch.Tensor | None) -> None:
        if prompt_aux is None:
            raise ValueError("Eagle3Drafter needs the target's aux hidden states")
        if prompt_aux.shape[-1] != self.model.fc.in_features:
            raise ValueError(
                f"target aux hidden states are {prompt_aux.shape[-1]} wide, the drafter's fc takes "
                f"{self.model.fc.in_features}: capture layers {list(self.aux_layer_ids)} in the target forward"
            )
        self._k = self._v = None
        self._next_pos = 1
        # The prompt's pairs join the cache at the first drafting step, as accepted ones do.
        self._queued = [(prompt_aux[:-1], prompt_ids[1:])]
        self._pending = prompt_aux[-1:]

    def accept(self, token_ids: torch.Tensor, aux: torch.Tensor | None) -> None:
        """Verified pairs join the cache at the next drafting step (in one call), as DSpark's
        context does: steps that do not draft cost nothing here."""
        if aux is None or aux.shape[0] != token_ids.shape[0]:
            raise ValueError("accept() needs one aux hidden row per accepted token")
        self._queued.append((torch.cat([self._pending, aux[:-1]]), token_ids))
        self._pending = aux[-1:]

    @torch.inference_mode()
    def propose(self, anchor: int, k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        k = min(k, self.config.speculative_steps)
        if k <= 0:
            return Proposal.empty(self.device)
        if self._queued:
            features, tokens = zip(*self._queued, strict=True)
            self._queued = []
            self._add_pairs(torch.cat(features), torch.cat(tokens))
        t0 = time.perf_counter()
        model, layer = self.model, self.model.layer
        attn = layer.self_attn
        hidden = model.project(self._pending.to(self.device))  # [1, H]
        token = torch.tensor([anchor], device=self.device)
        keys, values = self._k, self._v
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for j in range(k):
            x = layer.attn_input(model.embed(token), hidden)
            q, kj, vj = attn.qkv(x, torch.tensor([self._next_pos + j], device=self.device))
            keys = kj if keys is None else torch.cat([keys, kj], dim=1)
            values = vj if values is None else torch.cat([values, vj], dim=1)
            hidden = layer.finish(model.attend(q, keys, values), hidden)
            logits = model.logits(hidden)[0]
            if params.greedy:
                draft_id = int(torch.argmax(logits))
            else:
                q_row = probabilities(logits, params)
                draft_id = int(torch.multinomial(q_row, 1, generator=generator).item())
                rows.append(q_row)
            tokens.append(int(self._draft_to_target[draft_id]))
            token = torch.tensor([tokens[-1]], device=self.device)
        probs = None
        if not params.greedy:
            probs = torch.zeros(len(tokens), self.target_vocab_size, device=self.device)
            probs[:, self._draft_to_target] = torch.stack(rows)
        self.timings["backbone"] += time.perf_counter() - t0
        return Proposal(tokens=torch.tensor(tokens, dtype=torch.long, device=self.device), probs=probs)


def fork_drafter(drafter):
    """A drafter with ``drafter``'s weights and settings and a state of its own: one per
    sequence of a batch. The modules and tensors it holds are shared, not copied (drafters
    replace their state tensors, never write into them); everything else is copied."""
    import copy

    memo: dict[int, object] = {}

    def share(obj, depth: int) -> None:
        for value in vars(obj).values():
            if isinstance(value, torch.nn.Module | torch.Tensor):
                memo[id(value)] = value
            elif depth < 3 and hasattr(value, "__dict__") and not isinstance(value, type):
                share(value, depth + 1)

    share(drafter, 0)
    return copy.deepcopy(drafter, memo)
