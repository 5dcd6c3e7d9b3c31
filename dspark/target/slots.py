"""Many sequences decoding at once over a slot KV cache: continuous batching for datagen.

`SlotDecoder` runs the target's own modules (embedding, decoder layers' projections and
norms, rotary embedding, MLP, final norm, head) with a preallocated cache of ``slots``
rows. Every decode step advances all slots by one token in one forward, each at its own
position; a slot whose sequence ended is refilled with the next prompt at once (one
prefill), so no row waits for the longest answer of a static batch and nothing is padded.

It covers the Llama-style decoders (Llama, Mistral without a sliding window, Qwen2,
Qwen3 with its q/k norms, SmolLM2): `SlotDecoder.check` compares its logits with the Hugging
Face forward on a short sequence and refuses a model it does not reproduce, so callers fall
back to ``generate``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from dspark.errors import DSparkError
from dspark.target.attention import block_attention, block_bias

# The `model_type`s of the Llama-style decoders this module reproduces (its tests cover llama
# and qwen3; `SlotDecoder.check` verifies any model at start-up).
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def model_type_it_runs(target_dir) -> str | None:
    """The ``model_type`` of the Hugging Face directory ``target_dir`` when it is one of
    `MODEL_TYPES`, read from config.json alone (nothing loaded); else None."""
    import json
    from pathlib import Path

    path = Path(target_dir) / "config.json"
    try:
        model_type = json.loads(path.read_text()).get("model_type") if path.is_file() else None
    except (OSError, ValueError):
        return None
    return model_type if model_type in MODEL_TYPES else None


class SlotDecoderUnsupportedError(DSparkError):
    """The target's architecture is not one `SlotDecoder` reproduces."""


def _rotary_apply(model):
    """The model family's own ``apply_rotary_pos_emb`` (its module defines the convention)."""
    module = importlib.import_module(type(model).__module__)
    fn = getattr(module, "apply_rotary_pos_emb", None)
    if fn is None:
        raise SlotDecoderUnsupportedError(f"{type(model).__name__}: no apply_rotary_pos_emb in {module.__name__}")
    return fn


class SlotDecoder:
    def __init__(self, model, *, slots: int, max_len: int) -> None:
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        needed = ("embed_tokens", "norm", "rotary_emb")
        if layers is None or any(not hasattr(inner, n) for n in needed):
            raise SlotDecoderUnsupportedError(
                f"{type(model).__name__}: not a Llama-style decoder (model.layers, norm, ...)"
            )
        cfg = model.config
        if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
            raise SlotDecoderUnsupportedError(f"{type(model).__name__}: sliding-window layers are not supported")
        for layer in layers:
            attn = getattr(layer, "self_attn", None)
            if attn is None or any(not hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
                raise SlotDecoderUnsupportedError(f"{type(model).__name__}: attention without q/k/v/o projections")
        self.model, self.inner, self.layers = model, inner, list(layers)
        self.head = model.get_output_embeddings()
        self.rope = _rotary_apply(model)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.scale = float(getattr(self.layers[0].self_attn, "scaling", self.head_dim**-0.5))
        self.slots, self.max_len = int(slots), int(max_len)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        # The cache holds `alloc` positions per slot: a little more than the longest sequence
        # (a multiple of 64, at most max_len), grown and shrunk as sequences come and go, so a
        # decode step attends over one contiguous block (see `_attend_block`).
        self.alloc = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._resize(min(self.max_len, 256))
        self.lengths = torch.zeros(self.slots, dtype=torch.long, device=self.device)  # tokens cached per slot
        self._slot_index = torch.arange(self.slots, device=self.device)
        self._prefix: list[int] | None = None
        self._prefix_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._prefix_states: list[torch.Tensor] = []  # its layer inputs and final state, for capture
        self.last_prefill_cached = 0  # prompt tokens the last prefill copied from the prefix cache

    # ------------------------------------------------------------------ cache room
    def _resize(self, alloc: int) -> None:
        """Reallocate the cache to ``alloc`` positions per slot, keeping what fits."""
        keep = min(self.alloc, alloc)
        shape = (self.slots, self.kv_heads, alloc, self.head_dim)
        for cache in (self.k, self.v):
            for i in range(len(self.layers)):
                fresh = torch.zeros(shape, device=self.device, dtype=self.dtype)
                if i < len(cache):
                    fresh[:, :, :keep] = cache[i][:, :, :keep]
                    cache[i] = fresh
                else:
                    cache.append(fresh)
        self.alloc = alloc

    def _ensure(self, need: int) -> None:
        """Room for ``need`` positions per slot; shrink when every slot needs far less."""
        if need > self.alloc:
            self._resize(min(self.max_len, -(-(need + 32) // 64) * 64))
        elif self.alloc > 512 and 2 * (need + 64) < self.alloc:
            held = max(need, int(self.lengths.max()))  # data of every slot stays
            if 2 * (held + 64) < self.alloc:
                self._resize(min(self.max_len, -(-(held + 32) // 64) * 64))

    # ------------------------------------------------------------------ forward pieces
    def _qkv(self, attn, h: torch.Tensor, positions: torch.Tensor):
        """q [B, H, T, D], k / v [B, KV, T, D] with rotary applied at ``positions`` [B, T]."""
        b, t, _ = h.shape
        q = attn.q_proj(h).view(b, t, self.heads, self.head_dim)
        k = attn.k_proj(h).view(b, t, self.kv_heads, self.head_dim)
        v = attn.v_proj(h).view(b, t, self.kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head before rotary
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = self.inner.rotary_emb(h, positions)
        q, k = self.rope(q, k, cos, sin)
        return q, k, v

    def _attend(self, q, k, v, mask=None, causal=False):
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            if q.shape[2] == 1 and not causal:
                # One query per sequence: fold each kv head's query group into the query
                # length, so K / V are read in place (no copy per query head).
                b, _, _, d = q.shape
                out = F.scaled_dot_product_attention(
                    q.view(b, self.kv_heads, rep, d), k, v, attn_mask=mask, scale=self.scale
                )
                return out.view(b, self.heads, 1, d)
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale)

    def _attend_block(self, q, k, v, mask, bias=None):
        """``w`` queries per sequence ``q`` [n, H, w, D] over the first n slots' whole allocated
        block ``k`` / ``v`` [n, KV, alloc, D] (contiguous), ``mask`` [n, 1, w, alloc] (``bias``:
        `block_bias` of it, made once per forward). On a CPU `block_attention`: two batched
        matmuls read that block 3x faster than SDPA's kernel reads a strided slice of it, and a
        sequence's result depends neither on the block's length nor on the other sequences."""
        if self.device.type != "cpu":
            return self._attend(q, k, v, mask)
        return block_attention(q, k, v, scale=self.scale, mask=mask, bias=bias)

    def _finish(self, layer, h, attn_out):
        b, _, t, _ = attn_out.shape
        h = h + layer.self_attn.o_proj(attn_out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def _logits(self, h_last: torch.Tensor) -> torch.Tensor:
        return self.head(self.inner.norm(h_last)).float()

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def prefill(self, slot: int, ids: Sequence[int], capture: Sequence[int] = ()):
        """Start ``slot`` over with ``ids``; the logits [V] of its last position. A prompt that
        begins with the prefix set by `set_prefix` copies its cached keys and values and
        computes only the rest. With ``capture`` (layer ids, as `TargetModel.forward` takes
        them): ``(logits, aux [t, len(capture)·H])``, the prefix's rows from its cache too."""
        t = len(ids)
        if not 0 < t < self.max_len:
            raise DSparkError(f"a prompt of {t} tokens does not fit a slot of {self.max_len}")
        self._ensure(t + 1)
        past = self._copy_prefix(slot, ids)
        capture = tuple(capture)
        states: dict[int, torch.Tensor] = {}
        h = self._run_prompt(slot, ids[past:], past, states, capture)
        self.lengths[slot] = t
        self.last_prefill_cached = past
        if not capture:
            return self._logits(h[0, -1])
        aux = self._aux(states, capture, h)[0]
        if past:
            cached = self._prefix_states
            head = self._aux({i: cached[i][None] for i in capture if i < len(self.layers)}, capture, cached[-1][None])
            aux = torch.cat([head[0], aux])
        return self._logits(h[0, -1]), aux

    @torch.inference_mode()
    def prefill_many(self, slots: Sequence[int], prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """`prefill` of several slots in one forward: the prompts' rows packed into one matrix
        for every product, each prompt's attention over its own slot. The logits [len(slots),
        V] of each prompt's last position. In bf16 the caches and logits equal ``prefill``'s
        one by one bit for bit (a row's bits do not depend on a product's row count on CPUs;
        tested); in float32 a many-row product may sum in another order (to rounding, as a
        batched decode step already does). No capture (the datagen engine's fill)."""
        if len(slots) != len(prompts) or not slots:
            raise ValueError("prefill_many: one prompt per slot, at least one")
        if len(set(slots)) != len(slots):
            raise ValueError("prefill_many: a slot appears twice")
        for ids in prompts:
            if not 0 < len(ids) < self.max_len:
                raise DSparkError(f"a prompt of {len(ids)} tokens does not fit a slot of {self.max_len}")
        self._ensure(max(len(ids) for ids in prompts) + 1)
        pasts = [self._copy_prefix(slot, ids) for slot, ids in zip(slots, prompts, strict=True)]
        news = [list(ids[past:]) for ids, past in zip(prompts, pasts, strict=True)]
        counts = [len(n) for n in news]
        x = torch.tensor([[t for n in news for t in n]], device=self.device)
        positions = torch.cat([torch.arange(p, p + c, device=self.device) for p, c in zip(pasts, counts, strict=True)])[
            None
        ]
        h = self.inner.embed_tokens(x)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer.self_attn, layer.input_layernorm(h), positions)
            outs, start = [], 0
            for slot, past, c in zip(slots, pasts, counts, strict=True):
                seg = slice(start, start + c)
                outs.append(self._prompt_attention(i, slot, past, q[:, :, seg], k[:, :, seg], v[:, :, seg]))
                start += c
            h = self._finish(layer, h, torch.cat(outs, dim=2))
        for slot, ids in zip(slots, prompts, strict=True):
            self.lengths[slot] = len(ids)
        self.last_prefill_cached = sum(pasts)
        # Each prompt's logits as `prefill` computes them (one row: in float32 a one-row
        # product sums in another order than a many-row one).
        ends = torch.tensor(counts).cumsum(0) - 1
        return torch.stack([self._logits(h[0, int(j)]) for j in ends])

    def _aux(self, states: dict[int, torch.Tensor], capture: Sequence[int], h: torch.Tensor) -> torch.Tensor:
        """[B, T, len(capture)·H]: id i is the input of layer i, id ``len(layers)`` the final
        normed state (HF ``hidden_states[i]``)."""
        last = len(self.layers)
        return torch.cat([self.inner.norm(h) if i == last else states[i] for i in capture], dim=-1)

    def _run_prompt(
        self, slot: int, ids: Sequence[int], past: int, states: dict | None = None, capture: tuple[int, ...] = ()
    ) -> torch.Tensor:
        t = len(ids)
        x = torch.tensor([list(ids)], device=self.device)
        positions = torch.arange(past, past + t, device=self.device)[None]
        h = self.inner.embed_tokens(x)
        for i, layer in enumerate(self.layers):
            if i in capture:
                states[i] = h
            q, k, v = self._qkv(layer.self_attn, layer.input_layernorm(h), positions)
            h = self._finish(layer, h, self._prompt_attention(i, slot, past, q, k, v))
        return h

    def _copy_prefix(self, slot: int, ids: Sequence[int]) -> int:
        """Copy the `set_prefix` keys and values into ``slot`` when ``ids`` begins with that
        prefix (and is longer); the positions copied (0 when it does not)."""
        n = len(self._prefix) if self._prefix is not None else 0
        if not n or len(ids) <= n or list(ids[:n]) != self._prefix:
            return 0
        for i in range(len(self.layers)):
            self.k[i][slot, :, :n] = self._prefix_kv[i][0]
            self.v[i][slot, :, :n] = self._prefix_kv[i][1]
        return n

    def _prompt_attention(self, i: int, slot: int, past: int, q, k, v) -> torch.Tensor:
        """Layer ``i`` of a prompt's prefill in ``slot``: its new keys / values ([1, KV, t, D])
        written after the ``past`` cached ones, and its queries' attention over the slot,
        each seeing the cached positions and, causally, the new ones."""
        t = q.shape[2]
        self.k[i][slot, :, past : past + t] = k[0]
        self.v[i][slot, :, past : past + t] = v[0]
        keys, values = self.k[i][slot : slot + 1, :, : past + t], self.v[i][slot : slot + 1, :, : past + t]
        if self.device.type == "cpu":  # the same sums as every other step (attention.py)
            return block_attention(q, keys, values, scale=self.scale)
        if past:
            seen = torch.arange(past + t, device=self.device)
            return self._attend(q, keys, values, seen[None, :] <= (past + torch.arange(t, device=self.device))[:, None])
        return self._attend(q, k, v, causal=True)

    @torch.inference_mode()
    def set_prefix(self, ids: Sequence[int]) -> None:
        """Cache the keys and values of a prefix many prompts share (a chat template's system
        turn), so `prefill` computes it once; its layer inputs too, for prompts whose prefill
        captures states. Uses slot 0 as scratch; call while no sequence is in a slot."""
        ids = list(ids)
        if not ids:
            self._prefix, self._prefix_kv, self._prefix_states = None, [], []
            return
        if len(ids) + 1 >= self.max_len:
            raise DSparkError(f"a prefix of {len(ids)} tokens does not fit a slot of {self.max_len}")
        self._ensure(len(ids) + 1)
        states: dict[int, torch.Tensor] = {}
        everything = tuple(range(len(self.layers)))
        h = self._run_prompt(0, ids, 0, states, everything)
        n = len(ids)
        self._prefix_kv = [(k[0, :, :n].clone(), v[0, :, :n].clone()) for k, v in zip(self.k, self.v, strict=True)]
        self._prefix_states = [states[i][0] for i in everything] + [h[0]]
        self._prefix = ids
        self.lengths[0] = 0

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, active: int | None = None) -> torch.Tensor:
        """Append one token to each of the first ``active`` slots (all by default; ``tokens``
        [active]); the logits [active, V] after it. Callers keep the sequences in progress in
        the first slots (`move`), so finished ones cost nothing."""
        n = self.slots if active is None else int(active)
        lengths = self.lengths[:n]
        span = int(lengths.max()) + 1
        if span > self.max_len:
            raise DSparkError(f"a slot would pass its {self.max_len} positions")
        self._ensure(span)
        mask = (torch.arange(self.alloc, device=self.device)[None, :] <= lengths[:, None])[:, None, None, :]
        h = self.inner.embed_tokens(tokens.to(self.device)[:, None])
        rows = self._slot_index[:n]
        bias = block_bias(mask) if self.device.type == "cpu" else None
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer.self_attn, layer.input_layernorm(h), lengths[:, None])
            self.k[i][rows, :, lengths] = k[:, :, 0]
            self.v[i][rows, :, lengths] = v[:, :, 0]
            h = self._finish(layer, h, self._attend_block(q, self.k[i][:n], self.v[i][:n], mask, bias))
        self.lengths[:n] += 1
        return self._logits(h[:, 0])

    @torch.inference_mode()
    def extend(self, tokens: Sequence[Sequence[int]], capture: Sequence[int] = ()):
        """Append ``tokens[s]`` (at least one each, any number) to slot ``s`` for the first
        ``len(tokens)`` slots in one forward; per slot ``(logits [t_s, V], aux [t_s, m·H] or
        None)``. A slot's length advances by its ``t_s``; `set_length` takes back what
        verification rejects (the stale keys and values past a length are never read: each
        step writes its positions before attending to them)."""
        n = len(tokens)
        counts = [len(t) for t in tokens]
        if min(counts) < 1:
            raise DSparkError("extend: every slot needs at least one token")
        width = max(counts)
        lengths = self.lengths[:n]
        span = int(lengths.max()) + width
        if span > self.max_len:
            raise DSparkError(f"a slot would pass its {self.max_len} positions")
        self._ensure(span)
        ids = torch.zeros(n, width, dtype=torch.long)
        for s, row in enumerate(tokens):
            ids[s, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
        offsets = torch.arange(width, device=self.device)
        positions = lengths[:, None] + offsets[None, :]  # [n, width]
        # Query j of slot s sees the cached positions <= lengths[s] + j (its own new ones causally);
        # on a CPU over the whole allocated block (`_attend_block`), elsewhere over the span.
        if self.device.type == "cpu":
            span = self.alloc
        mask = (torch.arange(span, device=self.device)[None, None, :] <= positions[:, :, None])[:, None]
        rows = self._slot_index[:n, None].expand(n, width)
        h = self.inner.embed_tokens(ids.to(self.device))
        capture = tuple(capture)
        states: dict[int, torch.Tensor] = {}
        bias = block_bias(mask) if self.device.type == "cpu" else None
        for i, layer in enumerate(self.layers):
            if i in capture:
                states[i] = h
            q, k, v = self._qkv(layer.self_attn, layer.input_layernorm(h), positions)
            self.k[i][rows, :, positions] = k.transpose(1, 2)
            self.v[i][rows, :, positions] = v.transpose(1, 2)
            attn = self._attend_block(q, self.k[i][:n, :, :span], self.v[i][:n, :, :span], mask, bias)
            h = self._finish(layer, h, attn)
        self.lengths[:n] += torch.as_tensor(counts, device=self.device)
        valid = torch.cat([h[s, :c] for s, c in enumerate(counts)])  # [sum t_s, H]
        logits = self._logits(valid).split(counts)
        if not capture:
            return [(lg, None) for lg in logits]
        aux = self._aux(states, capture, h)
        return [(lg, aux[s, :c]) for s, (lg, c) in enumerate(zip(logits, counts, strict=True))]

    def set_length(self, slot: int, length: int) -> None:
        """Keep the first ``length`` cached positions of ``slot`` (a rejected draft's go)."""
        if not 0 <= length <= int(self.lengths[slot]):
            raise DSparkError(f"slot {slot}: cannot set a length of {length} (it holds {int(self.lengths[slot])})")
        self.lengths[slot] = length

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s cached sequence into slot ``dst``."""
        t = int(self.lengths[src])
        for k, v in zip(self.k, self.v, strict=True):
            k[dst, :, :t] = k[src, :, :t]
            v[dst, :, :t] = v[src, :, :t]
        self.lengths[dst] = t

    def room(self, slot: int) -> int:
        return self.max_len - int(self.lengths[slot])

    @torch.inference_mode()
    def check(self, ids: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8), atol: float | None = None) -> None:
        """Refuse a model whose Hugging Face logits this decoder does not reproduce (prefill
        of all but one token, then one decode step), within the dtype's tolerance."""
        ids = list(ids)
        full = self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0].float()
        saved = self.lengths.clone()
        got_prefill = self.prefill(0, ids[:-1])
        tokens = torch.zeros(self.slots, dtype=torch.long)
        tokens[0] = ids[-1]
        got_decode = self.decode(tokens)[0]
        self.lengths.copy_(saved)
        tol = (
            atol
            if atol is not None
            else (1e-3 if self.dtype == torch.float32 else 0.15) * max(1.0, float(full.abs().max()))
        )
        err = max(float((got_prefill - full[-2]).abs().max()), float((got_decode - full[-1]).abs().max()))
        if not err <= tol:
            raise SlotDecoderUnsupportedError(
                f"{type(self.model).__name__}: the slot decoder's logits differ from the model's by {err:.3g} "
                f"(tolerance {tol:.3g}); this architecture needs the generate path"
            )


def shared_prefix(prompts: Sequence[Sequence[int]], minimum: int = 4) -> list[int]:
    """The longest prefix every prompt shares, one token short of the shortest prompt (its
    last token must be computed for the logits); empty when shorter than ``minimum``."""
    if not prompts:
        return []
    first = list(prompts[0])
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = min(n, next((i for i, (a, b) in enumerate(zip(first, p, strict=False)) if a != b), n))
    return first[:n] if n >= minimum else []


def continuous_generate(
    decoder: SlotDecoder,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_ids: set[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> Iterator[tuple[int, list[int]]]:
    """Yield ``(prompt index, response ids)`` as each sequence ends (stop token included),
    out of order. Greedy at ``temperature`` 0; else each prompt samples with its own
    generator seeded ``seed + index``, so a row does not depend on its neighbours."""
    from dspark.decoding.sampling import SamplingParams, probabilities, sample_rows

    params = SamplingParams(temperature=temperature, top_p=top_p)
    queue = iter(range(len(prompts)))
    # Per slot: the prompt index it answers, its tokens so far, its sampling generator. The
    # sequences in progress always fill slots 0 .. active-1.
    owner: list[int] = [-1] * decoder.slots
    out: list[list[int]] = [[] for _ in range(decoder.slots)]
    gens: list[torch.Generator | None] = [None] * decoder.slots
    next_tok = torch.zeros(decoder.slots, dtype=torch.long)
    done: list[tuple[int, list[int]]] = []

    def pick(logits: torch.Tensor, slot: int) -> int:
        if params.greedy:
            return int(logits.argmax())
        probs = probabilities(logits[None], params)[0]
        return int(torch.multinomial(probs, 1, generator=gens[slot]))

    def fill(empty: list[int]) -> list[int]:
        """Start the next prompts in the ``empty`` slots, their prompts prefilled together
        (`SlotDecoder.prefill_many`); the slots left empty when the prompts run out."""
        empty = list(empty)
        while empty:
            batch: list[tuple[int, int]] = []  # (slot, prompt index)
            for slot in empty:
                index = next(queue, None)
                if index is None:
                    break
                if len(prompts[index]) + max_new_tokens > decoder.max_len:
                    raise DSparkError(
                        f"prompt {index}: {len(prompts[index])} tokens + {max_new_tokens} new do not fit "
                        f"{decoder.max_len} positions"
                    )
                batch.append((slot, index))
            if not batch:
                break
            empty = empty[len(batch) :]
            logits = decoder.prefill_many([slot for slot, _ in batch], [prompts[i] for _, i in batch])
            for (slot, index), row in zip(batch, logits, strict=True):
                gens[slot] = None if params.greedy else torch.Generator().manual_seed(seed + index)
                first = pick(row, slot)
                if first in stop_ids or max_new_tokens == 1:
                    done.append((index, [first]))
                    empty.append(slot)  # answered already: the slot takes the next prompt
                    continue
                owner[slot], out[slot], next_tok[slot] = index, [first], first
        return empty

    def close(holes: list[int], active: int) -> int:
        """Keep the sequences in progress in the first slots: the last ones move into the holes."""
        for hole in sorted(holes, reverse=True):
            last = active - 1
            if hole != last:
                decoder.move(last, hole)
                owner[hole], out[hole], gens[hole], next_tok[hole] = owner[last], out[last], gens[last], next_tok[last]
            active -= 1
        return active

    decoder.set_prefix(shared_prefix(prompts))
    active = close(fill(list(range(decoder.slots))), decoder.slots)
    while True:
        yield from done
        done.clear()
        if active == 0:
            return
        logits = decoder.decode(next_tok[:active], active)
        # (Sampling: each row draws with its own generator.)
        chosen = logits.argmax(dim=-1).tolist() if params.greedy else sample_rows(logits, params, gens[:active])
        finished = []
        for slot in range(active):
            tok = chosen[slot]
            out[slot].append(tok)
            if tok in stop_ids or len(out[slot]) >= max_new_tokens:
                done.append((owner[slot], out[slot]))
                finished.append(slot)
            else:
                next_tok[slot] = tok
        active = close(fill(finished), active)
