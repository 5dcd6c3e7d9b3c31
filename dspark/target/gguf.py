"""Loading a GGUF causal LM into a normal (dequantised) Hugging Face model.

Uses transformers' own GGUF reader (``gguf_file=``), which needs the ``gguf`` package
(``pip install 'dspark[gguf]'``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from dspark.target.adapter import TargetError


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise TargetError("reading GGUF files needs the gguf package: pip install 'dspark[gguf]'")


def load_gguf(path: str | Path, *, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from a ``.gguf`` file, dequantised to ``dtype``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require_gguf()
    src = Path(path)
    if not src.is_file():
        raise TargetError(f"{src}: GGUF file not found")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=dtype)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise TargetError(f"{src}: cannot load GGUF model: {exc}") from None
    # The weights are dequantised: drop the GGUF marker so the model saves as a plain checkpoint.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    return model, tokenizer


def convert_gguf(path: str | Path, out_dir: str | Path, *, dtype: torch.dtype = torch.float32) -> Path:
    """Write a GGUF model as a Hugging Face directory (config, safetensors, tokenizer)."""
    model, tokenizer = load_gguf(path, dtype=dtype)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
