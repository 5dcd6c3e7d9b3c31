"""The DSpark family and its head-less sibling DFlash: one block-parallel backbone.

- config: `dspark.model.config.DSparkConfig` (``method`` is ``dspark`` with a Markov or
  confidence head, ``dflash`` without);
- model: `dspark.model.dspark.DSparkDraftModel`;
- runtime: `dspark.decoding.drafters.DSparkDrafter` (one parallel block per step; the
  confidence head, when present, shortens drafts by a threshold or a cost model);
- training: `dspark.training.forward.block_forward`;
- speculators ``config.json``: `dspark.formats.speculators` (``to_speculators_dict``);
- llama.cpp: ``draft-dspark`` GGUF (`dspark.formats.gguf`); vLLM: methods ``dspark`` and
  ``dflash``, whose reading of the exported fields `vllm_checks` states.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dspark.decoding.draft_length import StepCost
from dspark.decoding.drafters import DSparkDrafter
from dspark.decoding.step_timing import measure_step_cost
from dspark.errors import DSparkError
from dspark.families.registry import DrafterFamily, register
from dspark.formats.speculators import from_speculators_dict, require_fields, to_speculators_dict
from dspark.model.config import DSparkConfig
from dspark.model.dspark import DSparkDraftModel
from dspark.model.pairing import config_for_target
from dspark.training.forward import block_forward

BACKBONE_OPTIONS = frozenset(
    {"layers", "block_size", "aux_layers", "mask_token_id", "sample_from_anchor", "draft_vocab_size"}
)
HEAD_OPTIONS = frozenset({"markov_rank", "markov_head_type", "confidence_head"})


def _config(target, options: dict, *, heads: bool) -> DSparkConfig:
    markov_rank = int(options.get("markov_rank", 256)) if heads else 0
    confidence = bool(options.get("confidence_head", True)) if heads else False
    return config_for_target(
        target,
        num_layers=int(options.get("layers", 1)),
        block_size=int(options.get("block_size", 8)),
        aux_layers=options.get("aux_layers"),
        mask_token_id=options.get("mask_token_id"),
        markov_rank=markov_rank,
        markov_head_type=options.get("markov_head_type", "vanilla"),
        enable_confidence_head=confidence,
        confidence_head_with_markov=confidence and markov_rank > 0,
        sample_from_anchor=bool(options.get("sample_from_anchor", True)),
        draft_vocab_size=options.get("draft_vocab_size"),
    )


def _runtime(model, target, *, confidence_threshold: float | None = None, cost_model: str | Path | None = None):
    try:
        drafter = DSparkDrafter(model, target_vocab_size=target.vocab_size, confidence_threshold=confidence_threshold)
        if cost_model is not None:  # the setter checks the head and that only one rule is set
            drafter.step_cost = (
                measure_step_cost(target, drafter) if str(cost_model) == "auto" else StepCost.load(cost_model)
            )
    except ValueError as exc:
        raise DSparkError(str(exc)) from None
    return drafter


def _vllm_checks(method: str):
    def checks(data: dict, path, k: int) -> list[str]:
        keys = (
            "transformer_layer_config",
            "draft_vocab_size",
            "block_size",
            "aux_hidden_state_layer_ids",
            "mask_token_id",
            "sample_from_anchor",
        )
        done = require_fields(data, path, keys, f"vLLM's {method} method reads it")
        if method == "dflash":
            # vLLM 0.32.0 (vllm/v1/worker/gpu/spec_decode/dflash/speculator.py) refuses this layout:
            # its DFlash runner has a fixed [bonus anchor + N masks] query layout.
            if data["sample_from_anchor"]:
                raise DSparkError(
                    f"{path}: sample_from_anchor=true (slot 0 predicts the next token) is a layout vLLM's dflash "
                    "method refuses; serve this drafter with `dspark serve` or llama.cpp, or train a DFlash "
                    "drafter with --no-sample-from-anchor for vLLM"
                )
            # vLLM reads `dflash_config.causal = not sliding_window_non_causal` (default true when absent).
            if data.get("sliding_window_non_causal") is False:
                raise DSparkError(
                    f"{path}: sliding_window_non_causal=false makes vLLM run the draft block causally, not as "
                    "trained; re-export it with this version of `dspark export` (it writes true)"
                )
            done.append("sample_from_anchor false and a bidirectional block, as vLLM's dflash runner reads them")
        drafts = data["block_size"] if data["sample_from_anchor"] else data["block_size"] - 1
        if not 1 <= k <= drafts:
            raise DSparkError(
                f"num_speculative_tokens {k} must be in [1, {drafts}] (drafts per block with "
                f"block_size {data['block_size']}, sample_from_anchor={data['sample_from_anchor']})"
            )
        done.append(f"num_speculative_tokens {k} <= {drafts} drafts per block")
        return done

    return checks


def _has_confidence_head(config: DSparkConfig) -> bool:
    return config.enable_confidence_head


DSPARK = register(
    DrafterFamily(
        name="dspark",
        summary="DFlash backbone + low-rank Markov logit-bias head + per-position confidence head",
        config_class=DSparkConfig,
        model_class=DSparkDraftModel,
        to_speculators=to_speculators_dict,
        from_speculators=from_speculators_dict,
        config_for_target=lambda target, options: _config(target, options, heads=True),
        init_options=BACKBONE_OPTIONS | HEAD_OPTIONS,
        runtime=_runtime,
        training_forward=block_forward,
        vllm_checks=_vllm_checks("dspark"),
        has_confidence_head=_has_confidence_head,
    )
)

# The same backbone without its heads: only the name, the init options and vLLM's method differ.
DFLASH = register(
    replace(
        DSPARK,
        name="dflash",
        summary="the block-parallel DFlash backbone alone (no heads)",
        config_for_target=lambda target, options: _config(target, options, heads=False),
        init_options=BACKBONE_OPTIONS,
        vllm_checks=_vllm_checks("dflash"),
    )
)
