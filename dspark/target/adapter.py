"""The target ("verifier") model behind one small interface.

`TargetModel` wraps any Hugging Face causal LM for single-sequence speculative decoding:
prefill and extend with a KV cache, crop the cache after a rejection, and capture the
hidden states of the aux layers (speculators convention: id ``i`` = HF
``hidden_states[i]``; ``0`` the embedding output, ``num_layers`` the final normed state).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dspark.errors import DSparkError


class TargetError(DSparkError):
    """The target directory or model cannot be used."""


@dataclass
class TargetStep:
    """What one target forward over ``n`` new tokens returns."""

    logits: torch.Tensor  # [n, V] fp32
    aux_hidden: torch.Tensor | None  # [n, m·H] in the model dtype, None when not captured


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
        self._aux_ids: tuple[int, ...] = ()
        self._hooks: list = []
        self._captured: dict[int, torch.Tensor] = {}
        self._capture = False
        self.cache = None

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

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        return self._aux_ids

    def embedding_weight(self) -> torch.Tensor:
        return self._embed.weight

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def mask_token_id(self) -> int | None:
        tok = self.tokenizer
        return None if tok is None else getattr(tok, "mask_token_id", None)

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
    def set_aux_layers(self, layer_ids: tuple[int, ...] | list[int]) -> None:
        """Capture HF ``hidden_states[i]`` for each id during `forward(capture=True)`."""
        ids = tuple(int(i) for i in layer_ids)
        bad = [i for i in ids if not 0 <= i <= self.num_layers]
        if bad:
            raise TargetError(
                f"aux layer ids {list(ids)}: {bad} outside [0, {self.num_layers}] for "
                f"{self.name} ({self.num_layers} decoder layers; id i = HF hidden_states[i])"
            )
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._aux_ids = ids

        def make_hook(layer_id: int):
            def hook(_module, _args, output):
                if self._capture:
                    out = output[0] if isinstance(output, tuple) else output
                    self._captured[layer_id] = out

            return hook

        for i in ids:
            if i == 0:
                module = self._embed
            elif i == self.num_layers:
                module = self._norm
            else:
                module = self._layers[i - 1]
            self._hooks.append(module.register_forward_hook(make_hook(i)))

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
    def forward(self, input_ids: torch.Tensor, *, capture: bool = False) -> TargetStep:
        """Run ``input_ids`` [n] after the cached positions; the cache grows by n."""
        if self.cache is None:
            self.reset()
        if capture and not self._aux_ids:
            raise TargetError("forward(capture=True) needs set_aux_layers() first")
        ids = input_ids.to(self.device).view(1, -1)
        self._capture = capture
        self._captured = {}
        try:
            out = self.model(input_ids=ids, use_cache=True, **{self._cache_kwarg: self.cache})
        finally:
            self._capture = False
        aux = None
        if capture:
            aux = torch.cat([self._captured[i][0] for i in self._aux_ids], dim=-1)
            self._captured = {}
        return TargetStep(logits=out.logits[0].float(), aux_hidden=aux)
