"""The hand-off to vLLM: the ``vllm serve`` command line and ``--speculative-config`` JSON for
a drafter checkpoint in the speculators format (method ``dspark``, ``dflash`` for a drafter
without heads, or ``eagle3``), after checking the checkpoint has what vLLM's method reads.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from dspark import families
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
    vllm_methods = [name for name in families.names() if families.get(name).vllm_checks is not None]
    if method not in vllm_methods:
        raise DSparkError(
            f"{path}: speculators_model_type {method!r}: vLLM has no method for it "
            f"(it serves {', '.join(vllm_methods)})"
        )
    fit = _fit_check(src, target)
    checks = families.get(method).vllm_checks(data, path, num_speculative_tokens)
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
    from dspark.formats.checkpoint import check_config_fits
    from dspark.target.frozen import read_target_shape

    shape = read_target_shape(target)
    if shape is None:
        return f"fit not checked: {target} is not a local Hugging Face directory (vLLM checks it at load)"
    check_config_fits(draft, shape)
    return f"fits target {target} (hidden {shape.hidden_size}, vocab {shape.vocab_size}, {shape.num_layers} layers)"
