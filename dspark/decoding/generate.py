"""One prompt decoded with one drafting setup, and the report `dspark generate` prints."""

from __future__ import annotations

from typing import Any

import torch

from dspark.decoding.factory import Drafting, make_engine
from dspark.decoding.sampling import SamplingParams


def generate_report(
    target,
    drafting: Drafting,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    params: SamplingParams,
    seed: int = 0,
    num_speculative_tokens: int | None = None,
    check_lossless: bool = False,
) -> dict[str, Any]:
    """Decode ``prompt_ids`` and report text, tokens, acceptance and speed (the keys
    ``dspark generate --json`` prints; README). ``check_lossless`` also runs plain greedy decoding and sets
    ``lossless`` (greedy only; sampling is lossless in distribution, tested statistically)."""
    drafting = drafting.resolved()  # read the checkpoint's family once
    drafter = drafting.build(target)
    engine = make_engine(target, drafter, num_speculative_tokens)
    gen = torch.Generator(device=target.device).manual_seed(seed)
    result = engine.generate(prompt_ids, max_new_tokens=max_new_tokens, params=params, generator=gen)
    lossless = None
    if check_lossless and params.greedy:
        plain = make_engine(target, None, 0).generate(prompt_ids, max_new_tokens=max_new_tokens, params=params)
        lossless = plain.tokens == result.tokens
    tok = target.tokenizer
    step_cost = getattr(drafter, "step_cost", None)
    report = {
        "text": tok.decode(result.tokens, skip_special_tokens=True) if tok is not None else None,
        "tokens": result.tokens,
        "method": drafter.name if drafting.prompt_lookup is not None else drafting.method,
        "num_speculative_tokens": engine.k,
        "accept_len": result.accept_len,
        "per_position_acceptance": result.per_position_acceptance,
        "tokens_per_second": result.tokens_per_second,
        "target_forwards": result.target_forwards,
        "prefill_seconds": result.prefill_seconds,
        "decode_seconds": result.decode_seconds,
        "prompt_tokens": result.prompt_tokens,
        "temperature": params.temperature,
        "seed": seed,
        "lossless": lossless,
        "drafted_tokens": result.drafted_tokens,
        "step_cost": step_cost.to_dict() if step_cost else None,
    }
    if result.lookup_steps is not None:
        report["lookup_steps"] = result.lookup_steps
    if check_lossless and not params.greedy:
        report["lossless_note"] = (
            "sampled output is lossless in distribution (rejection sampling); a token-by-token check "
            "applies to greedy decoding only"
        )
    return report
