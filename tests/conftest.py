from __future__ import annotations

import pytest
import torch

from dspark.interop.tiny_targets import build_tiny_target
from dspark.target import TargetModel

ARCHS = ["llama", "qwen3", "deepseek_v3"]


@pytest.fixture(scope="session")
def tiny_target_dirs(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("targets")
    return {arch: build_tiny_target(root / arch, arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def wider_target_dir(tmp_path_factory):
    """The qwen3 tiny target at hidden size 96: same tokenizer, no 64-wide drafter fits it."""
    return build_tiny_target(tmp_path_factory.mktemp("targets") / "wider", "qwen3", hidden_size=96)


@pytest.fixture(scope="session")
def tiny_targets(tiny_target_dirs) -> dict[str, TargetModel]:
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return {arch: TargetModel.from_pretrained(path) for arch, path in tiny_target_dirs.items()}
