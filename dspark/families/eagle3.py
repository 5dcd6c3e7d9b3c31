"""The EAGLE-3 family, the chain-drafting peer DSpark is compared with.

- config: `dspark.model.eagle3.Eagle3Config` (one Llama-style layer, ``speculative_steps``
  chain length it is trained to unroll);
- model: `dspark.model.eagle3.Eagle3DraftModel`;
- runtime: `dspark.decoding.drafters.Eagle3Drafter` (one layer forward per drafted token;
  no confidence head, so no threshold or cost model);
- training: `dspark.training.forward.eagle3_forward` (the training-time test);
- speculators ``config.json``: `dspark.formats.speculators` (``eagle3_to_speculators_dict``);
- vLLM: method ``eagle3``; llama.cpp: no GGUF (its ``draft-dspark`` is the DSpark family).
"""

from __future__ import annotations

from dspark.decoding.drafters import Eagle3Drafter
from dspark.errors import DSparkError
from dspark.families.dspark import BACKBONE_OPTIONS
from dspark.families.registry import DrafterFamily, register
from dspark.formats.speculators import eagle3_from_speculators_dict, eagle3_to_speculators_dict, require_fields
from dspark.model.eagle3 import Eagle3Config, Eagle3DraftModel
from dspark.model.pairing import config_for_target
from dspark.training.forward import eagle3_forward


def _config(target, options: dict) -> Eagle3Config:
    if int(options.get("layers", 1)) != 1:
        raise DSparkError("eagle3 has exactly one decoder layer (layers: 1)")
    steps = int(options.get("speculative_steps", int(options.get("block_size", 8)) - 1))
    base = config_for_target(
        target,
        aux_layers=options.get("aux_layers"),
        mask_token_id=0,  # no mask token: a chain drafts one real token at a time
        markov_rank=0,
        enable_confidence_head=False,
        draft_vocab_size=options.get("draft_vocab_size"),
    )
    return Eagle3Config.like(base, speculative_steps=steps)


def _runtime(model, target, *, confidence_threshold: float | None = None, cost_model=None):
    if confidence_threshold is not None or cost_model is not None:
        raise DSparkError(
            "--confidence-threshold and --cost-model need a drafter with a confidence head (eagle3 has none)"
        )
    return Eagle3Drafter(model, target_vocab_size=target.vocab_size)


def _vllm_checks(data: dict, path, k: int) -> list[str]:
    done = require_fields(
        data,
        path,
        ("transformer_layer_config", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids"),
        "vLLM's eagle3 method reads it",
    )
    methods = (data.get("speculators_config") or {}).get("proposal_methods") or [{}]
    trained = methods[0].get("speculative_tokens")
    if k < 1:
        raise DSparkError(f"num_speculative_tokens {k} must be >= 1")
    if trained is not None and k > int(trained):
        raise DSparkError(
            f"num_speculative_tokens {k} exceeds the {trained} chain steps this EAGLE-3 drafter was trained "
            f"to unroll (speculators_config.proposal_methods[0].speculative_tokens)"
        )
    done.append(f"num_speculative_tokens {k} <= {trained} trained chain steps")
    return done


EAGLE3 = register(
    DrafterFamily(
        name="eagle3",
        summary="EAGLE-3: one decoder layer drafting a chain, fed its own hidden states",
        config_class=Eagle3Config,
        model_class=Eagle3DraftModel,
        to_speculators=eagle3_to_speculators_dict,
        from_speculators=eagle3_from_speculators_dict,
        config_for_target=_config,
        init_options=(BACKBONE_OPTIONS - {"mask_token_id", "sample_from_anchor"}) | {"speculative_steps"},
        runtime=_runtime,
        training_forward=eagle3_forward,
        vllm_checks=_vllm_checks,
        gguf_refusal=(
            "GGUF export covers the DSpark/DFlash family (llama.cpp draft-dspark); an eagle3 drafter "
            "stays in the speculators format"
        ),
    )
)
