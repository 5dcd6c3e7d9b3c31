"""Build an engine for a named method: baseline, ngram, or a drafter checkpoint of a registered
family (`dspark.families`: dspark, dflash, eagle3, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dspark import families
from dspark.decoding.drafters import Drafter, LookupFirstDrafter, NgramDrafter
from dspark.decoding.engine import SpeculativeEngine
from dspark.defaults import DEFAULT_DRAFT_TOKENS
from dspark.errors import DSparkError
from dspark.formats.checkpoint import check_config_fits
from dspark.formats.convert import open_drafter
from dspark.target.adapter import TargetModel

BUILTIN_METHODS = ("baseline", "ngram")  # decoding without a drafter checkpoint


def methods() -> tuple[str, ...]:
    """Every method name: baseline, ngram and each registered drafter family."""
    return BUILTIN_METHODS + families.names()


def checkpoint_method(path: str | Path) -> str:
    """The family of a drafter directory, from its config.json (a .gguf is DSpark-family)."""
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
    if kind not in families.names():
        raise DSparkError(f"{config}: speculators_model_type {kind!r} is not one of {', '.join(families.names())}")
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
        if method not in families.names():
            raise DSparkError(
                f"--prompt-lookup wraps a drafter checkpoint ({', '.join(families.names())}), not {method}"
            )
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
    if method in BUILTIN_METHODS:
        if cost_model is not None or confidence_threshold is not None:
            raise DSparkError(
                f"--cost-model and --confidence-threshold need a drafter with a confidence head; {method} has none"
            )
        return None if method == "baseline" else NgramDrafter(target.vocab_size)
    if method not in families.names():
        raise DSparkError(f"unknown method {method!r}; choose from {', '.join(methods())}")
    if draft_dir is None:
        raise DSparkError(f"method {method!r} needs a drafter directory (--draft)")
    model = open_drafter(draft_dir, target=target, dtype=dtype)
    if getattr(target, "small_rows", False):  # its few-row products the fast way, as the target's
        from dspark.target.small_rows import rows_first_linear

        rows_first_linear(model, True)
    family = families.family_of(model.config)
    # dspark and dflash share one backbone: either name runs either checkpoint of it.
    if family.model_class is not families.get(method).model_class:
        raise DSparkError(f"{draft_dir}: holds a {model.config.method} drafter, not a {method} one")
    try:
        return family.runtime(model, target, confidence_threshold=confidence_threshold, cost_model=cost_model)
    except DSparkError as exc:
        raise DSparkError(f"{draft_dir}: {exc}") from None


@dataclass(frozen=True)
class Drafting:
    """Which drafter and how it drafts: the one option bundle of generate, serve and bench.

    ``method``: ``auto`` (the family named by ``draft``'s config.json), ``baseline``, ``ngram``
    or a drafter family (`dspark.families`); ``draft``: the checkpoint a family needs; a
    draft-length rule (``confidence_threshold`` or ``cost_model``: ``"auto"`` or a StepCost
    JSON); ``prompt_lookup`` N: draft by prompt lookup first (`LookupFirstDrafter`)."""

    method: str = "auto"
    draft: Path | None = None
    confidence_threshold: float | None = None
    cost_model: str | None = None
    prompt_lookup: int | None = None

    def resolved(self) -> Drafting:
        """``auto`` replaced by the checkpoint's family (read from its config.json only)."""
        if self.method != "auto":
            return self
        if self.draft is None:
            raise DSparkError("method auto needs a drafter checkpoint (--draft)")
        return Drafting(
            checkpoint_method(self.draft), self.draft, self.confidence_threshold, self.cost_model, self.prompt_lookup
        )

    def build(self, target: TargetModel, *, dtype: torch.dtype | None = None) -> Drafter | None:
        """The drafter for ``target`` (None for baseline)."""
        spec = self.resolved()
        return make_drafter(
            spec.method,
            target,
            draft_dir=spec.draft,
            confidence_threshold=spec.confidence_threshold,
            cost_model=spec.cost_model,
            dtype=dtype,
            prompt_lookup=spec.prompt_lookup,
        )


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
