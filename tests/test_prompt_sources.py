"""Training prompt sources: stable across processes, and a truncated ShareGPT dump read to its last whole object."""

import json
import subprocess
import sys

import pytest

from dspark.errors import DSparkError
from dspark.training.prompt_sources import sharegpt_prompts, stdlib_code_prompts, stdlib_completion_prompts


def test_stdlib_prompts_are_the_same_in_every_process():
    # A signature with a sentinel default used to print its memory address into the prompt.
    code = "from dspark.training.prompt_sources import *; print(repr(stdlib_completion_prompts()))"
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout for _ in "ab"
    ]
    assert runs[0] == runs[1]
    prompts = stdlib_completion_prompts()
    assert len(prompts) > 100 and len(stdlib_code_prompts()) == len(prompts)
    assert not [p for p in prompts + stdlib_code_prompts() if " at 0x" in p]


def test_sharegpt_reads_whole_conversations_of_a_cut_file(tmp_path):
    convs = [
        {"id": "a", "conversations": [{"from": "human", "value": "first question"}, {"from": "gpt", "value": "x"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "starts with the model: skipped"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "y" * 50}]},
        {"id": "d", "conversations": [{"from": "human", "value": "second question"}]},
    ]
    text = json.dumps(convs)
    cut = tmp_path / "sharegpt.json"
    cut.write_text(text[: text.rfind('"second')])  # cut inside the last object, as the PyPI file is
    assert sharegpt_prompts(cut, max_chars=40) == ["first question"]
    assert sharegpt_prompts(cut) == ["first question", "y" * 50]
    assert sharegpt_prompts(cut, limit=1) == ["first question"]
    whole = tmp_path / "whole.json"
    whole.write_text(text)
    assert sharegpt_prompts(whole)[-1] == "second question"
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DSparkError, match="not a JSON list"):
        sharegpt_prompts(tmp_path / "bad.json")
    with pytest.raises(DSparkError, match="not found"):
        sharegpt_prompts(tmp_path / "missing.json")
