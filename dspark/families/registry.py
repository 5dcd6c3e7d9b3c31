"""What a drafter family is, and the registry every other part of dspark dispatches through.

A family is one kind of drafter: DSpark, DFlash (the DSpark backbone without its heads),
EAGLE-3. `DrafterFamily` gathers in one object everything the rest of the package needs
to know about a kind: its config class and model, how the runtime drafts with it, how it
trains, how its speculators ``config.json`` reads and writes, what it needs from the target
and which hand-offs (vLLM, llama.cpp) it supports. The name is the one string users see:
``--method``, ``drafter.method`` in a recipe, ``speculators_model_type`` in ``config.json``
and ``config.method``.

Adding a family: write its module (config, model, drafter, codec) and ``register`` a
`DrafterFamily`; the built-in ones are registered by `dspark.families`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dspark.errors import DSparkError


def _no_problems(config: Any, target: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class DrafterFamily:
    """One drafter kind, declared in one place.

    Every config a family makes has ``method`` (the family name), ``aux_hidden_state_layer_ids``
    (the target layers it reads), ``target_hidden_size``, ``target_vocab_size``,
    ``num_target_layers``, ``draft_vocab_size``, ``hidden_size``, ``drafts_per_block`` and
    ``uses_pruned_vocab``; every model has ``config``, ``state_dict`` and the target-tied vocab
    (`dspark.model.vocab.TargetTiedVocab`).
    """

    name: str
    summary: str
    config_class: type
    model_class: type
    # The speculators config.json: ``to_speculators(config) -> dict``;
    # ``from_speculators(data, *, source, num_target_layers) -> config``.
    to_speculators: Callable[[Any], dict]
    from_speculators: Callable[..., Any]
    # A config sized for a loaded target from init options (``dspark init``, a recipe's drafter
    # section): ``config_for_target(target, options) -> config``; ``init_options`` names the
    # options it reads, so an unknown one is refused by name.
    config_for_target: Callable[[Any, dict], Any]
    init_options: frozenset[str]
    # The decoding engine's drafter: ``runtime(model, target, *, confidence_threshold, cost_model)``
    # (a `dspark.decoding.drafters.Drafter`); raises `DSparkError` for options it cannot honour.
    runtime: Callable[..., Any]
    # Teacher-forced forward over anchored blocks (`dspark.training.forward.BlockOutputs`);
    # None: the family cannot be trained here.
    training_forward: Callable[..., Any] | None = None
    # Fit problems beyond the shared sizes and layer ids (e.g. a mask token inside the vocab).
    fit_problems: Callable[[Any, Any], list[str]] = _no_problems
    # vLLM's reading of the exported config.json: ``vllm_checks(data, path, k) -> [check, ...]``,
    # raising `DSparkError` where vLLM would misread or refuse it; None: vLLM has no such method.
    vllm_checks: Callable[[dict, Any, int], list[str]] | None = None
    # Why a llama.cpp GGUF cannot carry this family (None: `dspark.formats.gguf` writes it).
    gguf_refusal: str | None = None
    # Whether drafts can be cut short per step (confidence threshold, cost model).
    has_confidence_head: Callable[[Any], bool] = field(default=lambda config: False)


_REGISTRY: dict[str, DrafterFamily] = {}


def register(family: DrafterFamily) -> DrafterFamily:
    """Add a family under its name; a second family of the same name is refused."""
    known = _REGISTRY.get(family.name)
    if known is not None and known is not family:
        raise DSparkError(f"a drafter family named {family.name!r} is already registered")
    _REGISTRY[family.name] = family
    return family


def unregister(name: str) -> None:
    """Remove a family (tests that register their own)."""
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get(name: str) -> DrafterFamily:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise DSparkError(f"unknown drafter family {name!r}; known: {', '.join(_REGISTRY)}") from None


def family_of(config: Any) -> DrafterFamily:
    """The family a config belongs to (its ``method``)."""
    return get(config.method)


def training_forward(config: Any) -> Callable[..., Any]:
    """The teacher-forced training forward of a config's family, or `DSparkError` if it has none."""
    family = family_of(config)
    if family.training_forward is None:
        raise DSparkError(f"{family.name} drafters cannot be trained by dspark (their family declares no forward)")
    return family.training_forward
