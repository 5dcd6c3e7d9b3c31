"""The hand-off to vLLM: the ``vllm serve`` command line and ``--speculative-config`` JSON for
a drafter checkpoint in the speculators format (method ``dspark``, ``dflash`` for a drafter
without heads, or ``eagle3``), after checking the checkpoint has what vLLM's method reads.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from dspark.defaults import DEFAULT_DRAFT_TOKENS
from dspark.errors import DSparkError
from dspark.formats.speculators import CONFIG_NAME, read_json


def vllm_handoff(
    draft: str | Path,
    target: str | Path,
    *,
    num_speculative_tokens: int = DEFAULT_DRAFT_TOKENS,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_model_len: int | None = None,
) -> dict:
    """``{"speculative_config": {...}, "command": "vllm serve ...", "checks": [...]}``."""
    src = Path(draft)
    path = src / CONFIG_NAME
    if not path.is_file():
        raise DSparkError(
            f"{src}: no speculators config.json; export it first: dspark export {src} --format speculators --out DIR"
        )
    data = read_json(path)
    method = data.get("speculators_model_type")
    if method not in ("dspark", "dflash", "eagle3"):
        raise DSparkError(
            f"{path}: speculators_model_type {method!r}: vLLM's dspark, dflash and eagle3 methods need one of those"
        )
    fit = _fit_check(src, target)
    if method == "eagle3":
        checks = _eagle3_checks(data, path, num_speculative_tokens)
    else:
        checks = _block_checks(data, path, method, num_speculative_tokens)
    if (Path(src) / "model.safetensors").is_file() is False:
        raise DSparkError(f"{src}: model.safetensors is missing")
    checks.append(fit)
    spec = {"model": str(src.resolve()), "num_speculative_tokens": num_speculative_tokens, "method": method}
    args = ["vllm", "serve", str(target), "--host", host, "--port", str(port), "--speculative-config", json.dumps(spec)]
    if max_model_len:
        args += ["--max-model-len", str(max_model_len)]
    return {"speculative_config": spec, "command": shlex.join(args), "argv": args, "checks": checks}


def _fit_check(draft: Path, target: str | Path) -> str:
    """The pair checked as `dspark generate` checks it (`check_fits`), from the two configs."""
    from dspark.model.pairing import check_config_fits
    from dspark.target.frozen import read_target_shape

    shape = read_target_shape(target)
    if shape is None:
        return f"fit not checked: {target} is not a local Hugging Face directory (vLLM checks it at load)"
    check_config_fits(draft, shape)
    return f"fits target {target} (hidden {shape.hidden_size}, vocab {shape.vocab_size}, {shape.num_layers} layers)"


def _require(data: dict, path: Path, method: str, keys: tuple[str, ...]) -> list[str]:
    for key in keys:
        if key not in data or data[key] is None:
            raise DSparkError(f"{path}: field {key!r} is missing; vLLM's {method} method reads it")
    return [f"{key} present" for key in keys]


def _block_checks(data: dict, path: Path, method: str, k: int) -> list[str]:
    keys = (
        "transformer_layer_config",
        "draft_vocab_size",
        "block_size",
        "aux_hidden_state_layer_ids",
        "mask_token_id",
        "sample_from_anchor",
    )
    checks = _require(data, path, method, keys)
    if method == "dflash":
        # vLLM 0.32.0 (vllm/v1/worker/gpu/spec_decode/dflash/speculator.py) refuses this layout:
        # its DFlash runner has a fixed [bonus anchor + N masks] query layout.
        if data["sample_from_anchor"]:
            raise DSparkError(
                f"{path}: sample_from_anchor=true (slot 0 predicts the next token) is a layout vLLM's dflash "
                "method refuses; serve this drafter with `dspark serve` or llama.cpp, or train a DFlash drafter "
                "with --no-sample-from-anchor for vLLM"
            )
        # vLLM reads `dflash_config.causal = not sliding_window_non_causal` (default true when absent).
        if data.get("sliding_window_non_causal") is False:
            raise DSparkError(
                f"{path}: sliding_window_non_causal=false makes vLLM run the draft block causally, not as trained; "
                "re-export it with this version of `dspark export` (it writes true)"
            )
        checks.append("sample_from_anchor false and a bidirectional block, as vLLM's dflash runner reads them")
    drafts = data["block_size"] if data["sample_from_anchor"] else data["block_size"] - 1
    if not 1 <= k <= drafts:
        raise DSparkError(
            f"num_speculative_tokens {k} must be in [1, {drafts}] (drafts per block with "
            f"block_size {data['block_size']}, sample_from_anchor={data['sample_from_anchor']})"
        )
    checks.append(f"num_speculative_tokens {k} <= {drafts} drafts per block")
    return checks


def _eagle3_checks(data: dict, path: Path, k: int) -> list[str]:
    checks = _require(
        data, path, "eagle3", ("transformer_layer_config", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids")
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
    checks.append(f"num_speculative_tokens {k} <= {trained} trained chain steps")
    return checks
