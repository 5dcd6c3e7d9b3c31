"""The target ("verifier") model behind one small interface.

`TargetModel` wraps any Hugging Face causal LM for single-sequence speculative decoding:
prefill and extend with a KV cache, crop the cache after a rejection, and capture the
hidden states of the aux layers (speculators convention: id ``i`` = HF
``hidden_states[i]``; ``0`` the embedding output, ``num_layers`` the final normed state).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from dspark.errors import DSparkError
from dspark.target.attention import use_block_attention
from dspark.target.small_rows import enabled_by_default, rows_first_linear


class TargetError(DSparkError):
    """The target directory or model cannot be used."""


class TargetStep:
    """What one target forward over ``n`` new tokens returns.

    ``logits`` [n, V] fp32 and ``aux_hidden`` [n, m·H] (model dtype; None when not captured).
    When the target was run with a deferred head, logits rows are computed on first use:
    `rows(start, stop)` pays the output projection for those rows only (a rejected draft
    needs no logits after it; a prefill needs only its last row).
    """

    def __init__(
        self,
        logits: torch.Tensor | None = None,
        aux_hidden: torch.Tensor | None = None,
        *,
        hidden: torch.Tensor | None = None,
        head=None,
    ) -> None:
        if logits is None and (hidden is None or head is None):
            raise ValueError("TargetStep needs logits, or the final hidden states and the head")
        self._logits = logits
        self._hidden = hidden
        self._head = head
        self.aux_hidden = aux_hidden

    def __len__(self) -> int:
        return int((self._logits if self._logits is not None else self._hidden).shape[0])

    @property
    def deferred(self) -> bool:
        """True while the logits rows are still computed on demand."""
        return self._logits is None

    @property
    def logits(self) -> torch.Tensor:
        if self._logits is None:
            with torch.inference_mode():
                self._logits = self._head(self._hidden).float()
        return self._logits

    def rows(self, start: int, stop: int | None = None) -> torch.Tensor:
        """Logits rows ``[start, stop)`` (negative indices as in Python slicing)."""
        if self._logits is not None:
            return self._logits[start:stop]
        with torch.inference_mode():
            return self._head(self._hidden[start:stop]).float()


def _decoder_parts(model: nn.Module) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
    """(input embedding, decoder layer list, final norm) of a HF causal LM."""
    base = getattr(model, "model", None) or getattr(model, "base_model", None)
    layers = getattr(base, "layers", None)
    norm = getattr(base, "norm", None)
    if not isinstance(layers, nn.ModuleList) or norm is None:
        raise TargetError(
            f"{type(model).__name__}: cannot find the decoder layers and final norm "
            "(expected model.model.layers and model.model.norm, as in Llama/Qwen3/DeepSeek-V3)"
        )
    return model.get_input_embeddings(), layers, norm


class TargetModel:
    """A HF causal LM with a KV cache and aux-layer capture, for one sequence at a time."""

    def __init__(self, model: nn.Module, tokenizer=None, *, name: str = "target") -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.config = model.config
        self._embed, self._layers, self._norm = _decoder_parts(model)
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.24 renamed `past_key_values` to `cache`.
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._hooked: set[int] = set()  # layer ids with a capture hook
        self._captured: dict[int, torch.Tensor] = {}
        self._capture: tuple[int, ...] = ()  # the ids the running forward asked for
        self.cache = None
        # Deferred output head: keep the final norm's output and project only the rows asked
        # for. Enabled after a one-time check that the model's logits are exactly head(norm(h))
        # (no soft-capping or scaling) and that it takes `logits_to_keep`.
        self.defer_head = True  # False: every forward projects every row (the plain HF call)
        self._final: torch.Tensor | None = None
        self._keep_final = False
        self._deferred_ok: bool | None = None
        self._index_ok = False  # True once the model took an empty logits_to_keep index
        self._head = model.get_output_embeddings()
        self._has_logits_to_keep = "logits_to_keep" in params
        self._norm.register_forward_hook(self._final_hook)
        self.small_rows = False
        if enabled_by_default():
            self.set_small_rows(True)
        # CPU attention through `dspark.target.attention.block_attention`, as the slot decoder
        # computes it: a row's sums do not depend on how many queries or keys come with it.
        self.block_attention = os.environ.get("DSPARK_BLOCK_ATTENTION", "1") != "0" and use_block_attention(model)

    def set_small_rows(self, on: bool) -> None:
        """Float32 CPU products of up to 64 rows as W @ xᵀ (`dspark.target.small_rows`); on by
        default (``DSPARK_SMALL_ROWS=0``: off)."""
        rows_first_linear(self.model, on)
        self.small_rows = on

    def _final_hook(self, _module, _args, output) -> None:
        if self._keep_final:
            self._final = output[0] if isinstance(output, tuple) else output

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> TargetModel:
        """Load a Hugging Face model directory, or a ``.gguf`` file (dequantised)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        src = Path(path)
        if src.is_file() and src.suffix == ".gguf":
            from dspark.target.gguf import load_gguf

            model, tokenizer = load_gguf(src, dtype=dtype)
            return cls(model.to(device), tokenizer, name=str(src))
        if not src.is_dir():
            raise TargetError(f"{src}: target directory not found")
        if not (src / "config.json").is_file():
            raise TargetError(f"{src}: no config.json (expected a Hugging Face model directory)")
        try:
            model = AutoModelForCausalLM.from_pretrained(str(src), dtype=dtype)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise TargetError(f"{src}: cannot load the target model: {exc}") from None
        tokenizer = None
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(src))
        except (OSError, ValueError, TypeError):
            tokenizer = None
        return cls(model.to(device), tokenizer, name=str(src))

    # ------------------------------------------------------------------ facts
    @property
    def device(self) -> torch.device:
        return self._embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self._embed.weight.dtype

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    def embedding_weight(self) -> torch.Tensor:
        return self._embed.weight

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    @torch.no_grad()  # not inference_mode: the trainer's autograd reads the result
    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's final norm applied to residual-stream states [n, H] (in the model's
        dtype): what capture id ``num_layers`` returns, from a state taken before the norm."""
        return self._norm(hidden.to(device=self.device, dtype=self.dtype))

    def stop_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.config, self.tokenizer):
            eos = getattr(source, "eos_token_id", None)
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, list | tuple):
                ids.update(int(e) for e in eos)
        return ids

    # ------------------------------------------------------------------ aux capture
    def check_layer_ids(self, layer_ids: Sequence[int]) -> tuple[int, ...]:
        """``layer_ids`` as a tuple, or `TargetError` naming the ids this target does not have."""
        ids = tuple(int(i) for i in layer_ids)
        bad = [i for i in ids if not 0 <= i <= self.num_layers]
        if bad:
            raise TargetError(
                f"aux layer ids {list(ids)}: {bad} outside [0, {self.num_layers}] for "
                f"{self.name} ({self.num_layers} decoder layers; id i = HF hidden_states[i])"
            )
        return ids

    def _hook_layers(self, ids: tuple[int, ...]) -> None:
        """A capture hook on each layer of ``ids`` not hooked yet. Hooks stay: each records
        only while a forward asks for its layer, so callers never share capture state."""

        def make_hook(layer_id: int):
            def hook(_module, _args, output):
                if layer_id in self._capture:
                    self._captured[layer_id] = output[0] if isinstance(output, tuple) else output

            return hook

        for i in ids:
            if i in self._hooked:
                continue
            if i == 0:
                module = self._embed
            elif i == self.num_layers:
                module = self._norm
            else:
                module = self._layers[i - 1]
            module.register_forward_hook(make_hook(i))
            self._hooked.add(i)

    # ------------------------------------------------------------------ cache
    def reset(self) -> None:
        from transformers import DynamicCache

        try:
            self.cache = DynamicCache(config=self.config)
        except TypeError:  # older transformers
            self.cache = DynamicCache()

    @property
    def cache_len(self) -> int:
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    def crop(self, length: int) -> None:
        """Keep the first ``length`` cached positions."""
        drop = self.cache_len - length
        if drop < 0:
            raise ValueError(f"cannot crop a cache of {self.cache_len} positions to {length}")
        if drop:
            # Negative argument = number of positions to drop; accepted by transformers 4.x and 5.x.
            self.cache.crop(-drop)

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, *, capture: Sequence[int] = ()) -> TargetStep:
        """Run ``input_ids`` [n] after the cached positions; the cache grows by n.

        ``capture``: the layer ids (HF ``hidden_states[i]``) whose states come back as
        ``aux_hidden`` [n, len(capture)·H], in that order; empty: none."""
        if self.cache is None:
            self.reset()
        capture = self.check_layer_ids(capture)
        self._hook_layers(capture)
        ids = input_ids.to(self.device).view(1, -1)
        deferred = (
            self.defer_head and self._deferred_ok is not False and self._has_logits_to_keep and self._head is not None
        )
        checking = deferred and self._deferred_ok is None
        kwargs = {self._cache_kwarg: self.cache}
        if deferred:
            # After the check, an empty index: the model projects no row itself.
            kwargs["logits_to_keep"] = 1 if checking else torch.empty(0, dtype=torch.long, device=self.device)
        start = self.cache_len
        self._capture = capture
        self._captured = {}
        self._keep_final = deferred
        try:
            out = self.model(input_ids=ids, use_cache=True, **kwargs)
        except (TypeError, IndexError, ValueError, RuntimeError):
            if not deferred or checking or self._index_ok:
                raise
            # This model does not take an index list for logits_to_keep: project the plain way.
            self._deferred_ok = False
            self._final = None
            self.crop(start)
            return self.forward(input_ids, capture=capture)
        finally:
            self._capture = ()
            self._keep_final = False
        final, self._final = self._final, None
        self._index_ok = self._index_ok or (deferred and not checking)
        aux = None
        if capture:
            aux = torch.cat([self._captured[i][0] for i in capture], dim=-1)
            self._captured = {}
        if not deferred:
            return TargetStep(logits=out.logits[0].float(), aux_hidden=aux)
        hidden = final[0]
        if checking:
            # One-time check that head(final norm) is the model's own last logits row.
            mine = self._head(hidden[-1:]).float()
            theirs = out.logits[0].float()
            self._deferred_ok = bool(mine.shape == theirs.shape and torch.allclose(mine, theirs, rtol=1e-4, atol=1e-4))
            if not self._deferred_ok:
                # This model post-processes its logits: recompute this step the plain way.
                self.crop(start)
                return self.forward(input_ids, capture=capture)
        return TargetStep(aux_hidden=aux, hidden=hidden, head=self._head)
