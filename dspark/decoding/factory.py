"""Build an engine for a named method: baseline, ngram, or a drafter checkpoint (dspark/dflash/eagle3)."""

from __future__ import annotations

from pathlib import Path

import torch

from dspark.decoding.draft_length import StepCost, measure_step_cost
from dspark.decoding.drafters import Drafter, DSparkDrafter, Eagle3Drafter, LookupFirstDrafter, NgramDrafter
from dspark.decoding.engine import SpeculativeEngine
from dspark.defaults import DEFAULT_DRAFT_TOKENS
from dspark.errors import DSparkError
from dspark.model.checkpoint import load_drafter
from dspark.model.pairing import check_config_fits, check_fits
from dspark.target.adapter import TargetModel

METHODS = ("baseline", "ngram", "dspark", "dflash", "eagle3")
DRAFTER_METHODS = ("dspark", "dflash", "eagle3")


def checkpoint_method(path: str | Path) -> str:
    """dspark / dflash / eagle3, from a drafter directory's config (a .gguf is DSpark-family)."""
    import json

    path = Path(path)
    if not path.exists():
        raise DSparkError(f"{path}: no such drafter file or directory")
    if path.suffix == ".gguf":
        return "dspark"
    config = path / "config.json"
    if not config.is_file():
        raise DSparkError(f"{path}: not a drafter directory (no config.json)")
    try:
        kind = json.loads(config.read_text()).get("speculators_model_type")
    except (json.JSONDecodeError, AttributeError):
        raise DSparkError(f"{config}: not a valid drafter config (JSON object expected)") from None
    if kind not in DRAFTER_METHODS:
        raise DSparkError(f"{config}: speculators_model_type {kind!r} is not one of {', '.join(DRAFTER_METHODS)}")
    return kind


def precheck_pair(target: str | Path, draft: str | Path) -> str:
    """Before anything heavy loads: the drafter path exists and names its method, the target
    path exists, and (from the two config.json files alone) the drafter fits the target.
    Returns the drafter's method. A .gguf side or a target that is no local directory (a hub
    id) is checked in full when it loads."""
    from dspark.target.frozen import read_target_shape

    method = checkpoint_method(draft)
    target = Path(target)
    if target.suffix == ".gguf" and not target.is_file():
        raise DSparkError(f"{target}: no such target file")
    shape = read_target_shape(target)
    if shape is not None and Path(draft).suffix != ".gguf":
        check_config_fits(draft, shape)
    return method


def load_drafter_for(target: TargetModel, draft: str | Path, *, dtype: torch.dtype | None = None):
    """A drafter model (directory or llama.cpp .gguf) on the target's device and dtype, with the
    target's embedding / head where the checkpoint leaves them out, checked against the target;
    the target then captures the drafter's aux layers."""
    if Path(draft).suffix == ".gguf":  # a llama.cpp draft, dequantised: measure a quantised drafter
        from dspark.formats.gguf import read_gguf

        model = read_gguf(
            draft,
            num_target_layers=target.num_layers,
            target_embedding=target.embedding_weight(),
            target_lm_head=target.lm_head_weight(),
        ).to(device=target.device, dtype=dtype or target.dtype)
    else:
        check_config_fits(draft, target)
        model = load_drafter(
            draft,
            device=target.device,
            dtype=dtype or target.dtype,
            target_embedding=target.embedding_weight(),
            target_lm_head=target.lm_head_weight(),
            num_target_layers=target.num_layers,
        )
    check_fits(model.config, target)
    target.set_aux_layers(model.config.aux_hidden_state_layer_ids)
    return model


def make_drafter(
    method: str,
    target: TargetModel,
    *,
    draft_dir: str | Path | None = None,
    confidence_threshold: float | None = None,
    cost_model: str | Path | None = None,
    dtype: torch.dtype | None = None,
    prompt_lookup: int | None = None,
) -> Drafter | None:
    """``cost_model``: ``"auto"`` measures this machine's step cost now (a few seconds), a path
    loads a saved `StepCost` JSON; either picks each step's draft length (draft_length.py).
    ``prompt_lookup`` N (a drafter method only): draft the continuation of an earlier occurrence
    of the last N tokens when there is one, the model's block otherwise (`LookupFirstDrafter`)."""
    if prompt_lookup is not None:
        if method not in DRAFTER_METHODS:
            raise DSparkError(f"--prompt-lookup wraps a drafter checkpoint (dspark, dflash, eagle3), not {method}")
        if prompt_lookup < 1:
            raise DSparkError(f"--prompt-lookup must be an n-gram length >= 1, got {prompt_lookup}")
        model_drafter = make_drafter(
            method,
            target,
            draft_dir=draft_dir,
            confidence_threshold=confidence_threshold,
            cost_model=cost_model,
            dtype=dtype,
        )
        return LookupFirstDrafter(model_drafter, target.vocab_size, min_ngram=prompt_lookup)
    if cost_model is not None and method not in ("dspark", "dflash"):
        raise DSparkError(f"--cost-model needs a drafter with a confidence head; {method} has none")
    if method == "baseline":
        return None
    if method == "ngram":
        return NgramDrafter(target.vocab_size)
    if method in ("dspark", "dflash", "eagle3"):
        if draft_dir is None:
            raise DSparkError(f"method {method!r} needs a drafter directory (--draft)")
        model = load_drafter_for(target, draft_dir, dtype=dtype)
        if (model.config.method == "eagle3") != (method == "eagle3"):
            raise DSparkError(f"{draft_dir}: holds a {model.config.method} drafter, not a {method} one")
        if method == "eagle3":
            if confidence_threshold is not None:
                raise DSparkError("--confidence-threshold needs a drafter with a confidence head (eagle3 has none)")
            return Eagle3Drafter(model, target_vocab_size=target.vocab_size)
        try:
            drafter = DSparkDrafter(
                model, target_vocab_size=target.vocab_size, confidence_threshold=confidence_threshold
            )
            if cost_model is not None:  # the setter checks head and rule
                drafter.step_cost = (
                    measure_step_cost(target, drafter) if str(cost_model) == "auto" else StepCost.load(cost_model)
                )
            return drafter
        except ValueError as exc:
            raise DSparkError(f"{draft_dir}: {exc}") from None
    raise DSparkError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def make_engine(target: TargetModel, drafter: Drafter | None, num_speculative_tokens: int | None) -> SpeculativeEngine:
    """``num_speculative_tokens=None`` means as many as the drafter offers (0 for baseline)."""
    if drafter is None:
        k = 0
    elif num_speculative_tokens is None:
        k = min(drafter.max_draft_tokens, DEFAULT_DRAFT_TOKENS)
    else:
        k = num_speculative_tokens
    if drafter is not None and k > drafter.max_draft_tokens:
        raise DSparkError(
            f"--num-speculative-tokens {k} is larger than the {drafter.name} drafter allows "
            f"({drafter.max_draft_tokens} drafts per block)"
        )
    if k < 0:
        raise DSparkError(f"--num-speculative-tokens must be >= 0, got {k}")
    return SpeculativeEngine(target, drafter, num_speculative_tokens=k)
