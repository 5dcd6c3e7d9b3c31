"""Drafter families as registered units: a family defined here, in the test file, is built by
`dspark init`, saved, loaded, named by its config.json and drafts in `dspark generate`, all
through the normal paths; and the built-in families declare what the rest of dspark asks."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from dspark import families
from dspark.cli import app
from dspark.decoding.drafters import point_mass
from dspark.decoding.factory import checkpoint_method, methods
from dspark.decoding.proposal import Proposal
from dspark.errors import DSparkError
from dspark.formats.checkpoint import load_drafter, save_drafter
from dspark.model.pairing import default_aux_layers
from dspark.model.vocab import TargetTiedVocab

runner = CliRunner()
LOSSLESS_12 = ("--max-new-tokens", "12", "--check-lossless")
NAME = "toy-unigram"


@dataclass(frozen=True)
class ToyConfig:
    hidden_size: int
    draft_vocab_size: int
    target_vocab_size: int
    target_hidden_size: int
    aux_hidden_state_layer_ids: tuple[int, ...]
    num_target_layers: int
    steps: int = 3
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    method = NAME

    @property
    def drafts_per_block(self) -> int:
        return self.steps

    @property
    def uses_pruned_vocab(self) -> bool:
        return False

    def replace(self, **changes: Any) -> ToyConfig:
        return replace(self, **changes)


class ToyModel(TargetTiedVocab, nn.Module):
    """Drafts the same token ``steps`` times: the argmax of the projected last feature."""

    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.embed_tokens = nn.Embedding(config.target_vocab_size, h)
        self.fc = nn.Linear(len(config.aux_hidden_state_layer_ids) * config.target_hidden_size, h, bias=False)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.target_vocab_size, dtype=torch.bool))


class ToyDrafter:
    name = NAME

    def __init__(self, model: ToyModel) -> None:
        self.model = model.eval()
        self.aux_layer_ids = model.config.aux_hidden_state_layer_ids
        self.last: torch.Tensor | None = None

    @property
    def max_draft_tokens(self) -> int:
        return self.model.config.steps

    def begin(self, prompt_ids, prompt_aux) -> None:
        self.last = prompt_aux[-1]

    def accept(self, token_ids, aux) -> None:
        self.last = aux[-1]

    @torch.inference_mode()
    def propose(self, anchor, k, params, generator) -> Proposal:
        logits = self.model.base_logits(self.model.fc(self.last.to(self.model.fc.weight.dtype)))
        token = int(self.model.draft_to_target[int(logits.argmax())])
        tokens = torch.full((k,), token, dtype=torch.long)
        probs = None if params.greedy else point_mass(tokens, self.model.config.target_vocab_size)
        return Proposal(tokens=tokens, probs=probs)


def _to_speculators(config: ToyConfig) -> dict:
    return {
        "speculators_model_type": NAME,
        "architectures": ["ToyUnigramSpeculator"],
        "hidden_size": config.hidden_size,
        "draft_vocab_size": config.draft_vocab_size,
        "target_vocab_size": config.target_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "aux_hidden_state_layer_ids": list(config.aux_hidden_state_layer_ids),
        "steps": config.steps,
        "dspark": {"num_target_layers": config.num_target_layers},
    }


def _from_speculators(data: dict, *, source: str, num_target_layers: int | None = None) -> ToyConfig:
    fields = {k: data[k] for k in ("hidden_size", "draft_vocab_size", "target_vocab_size", "target_hidden_size")}
    return ToyConfig(
        **fields,
        aux_hidden_state_layer_ids=tuple(data["aux_hidden_state_layer_ids"]),
        num_target_layers=data["dspark"]["num_target_layers"],
        steps=data["steps"],
    )


def _config_for_target(target, options: dict) -> ToyConfig:
    return ToyConfig(
        hidden_size=target.hidden_size,
        draft_vocab_size=target.vocab_size,
        target_vocab_size=target.vocab_size,
        target_hidden_size=target.hidden_size,
        aux_hidden_state_layer_ids=tuple(options.get("aux_layers") or default_aux_layers(target.num_layers)),
        num_target_layers=target.num_layers,
        steps=int(options.get("block_size", 4)) - 1,
    )


def _runtime(model, target, *, confidence_threshold=None, cost_model=None):
    if confidence_threshold is not None or cost_model is not None:
        raise DSparkError(f"{NAME} has no confidence head")
    return ToyDrafter(model)


@pytest.fixture
def toy_family():
    family = families.register(
        families.DrafterFamily(
            name=NAME,
            summary="test family: repeats one token",
            config_class=ToyConfig,
            model_class=ToyModel,
            to_speculators=_to_speculators,
            from_speculators=_from_speculators,
            config_for_target=_config_for_target,
            init_options=frozenset({"aux_layers", "block_size"}),
            runtime=_runtime,
            gguf_refusal=f"{NAME} has no GGUF layout",
        )
    )
    yield family
    families.unregister(NAME)


def test_a_family_registered_in_a_test_runs_init_save_load_and_generate(toy_family, tiny_target_dirs, tmp_path):
    target = str(tiny_target_dirs["qwen3"])
    out = tmp_path / "toy"
    made = runner.invoke(app, ["init", "--target", target, "--out", str(out), "--method", NAME, "--block-size", "5"])
    assert made.exit_code == 0, made.output
    assert f"untrained {NAME} drafter" in made.output and "4 drafts per step" in made.output
    assert json.loads((out / "config.json").read_text())["speculators_model_type"] == NAME
    assert checkpoint_method(out) == NAME and NAME in methods()

    # Save -> load round trip through the checkpoint code every family shares.
    model = load_drafter(out)
    assert isinstance(model, ToyModel) and model.config.steps == 4
    save_drafter(model, tmp_path / "again")
    again = load_drafter(tmp_path / "again")
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name

    # generate picks the family from config.json and stays lossless (greedy).
    gen = runner.invoke(
        app,
        ["generate", "--prompt", "one two three", "--target", target, "--draft", str(out), "--json", *LOSSLESS_12],
    )
    assert gen.exit_code == 0, gen.output
    last = gen.output.strip().splitlines()[-1]
    report = json.loads(last[last.index("{") :])  # after the target's loading bar
    assert report["method"] == NAME and report["lossless"] is True
    assert report["drafted_tokens"] > 0 and report["num_speculative_tokens"] == 4

    # Its declared limits are what the shared paths say.
    refused = runner.invoke(
        app,
        ["generate", "--prompt", "x", "--target", target, "--draft", str(out), "--confidence-threshold", "0.5"],
    )
    assert refused.exit_code != 0 and "no confidence head" in refused.output
    gguf = runner.invoke(
        app, ["export", str(out), "--target", target, "--format", "gguf", "--out", str(tmp_path / "toy.gguf")]
    )
    assert gguf.exit_code != 0 and "no GGUF layout" in gguf.output


def test_a_family_name_is_taken_once(toy_family):
    with pytest.raises(DSparkError, match="already registered"):
        families.register(replace(toy_family, summary="another"))
    with pytest.raises(DSparkError, match="unknown drafter family 'nope'"):
        families.get("nope")


def test_builtin_families_declare_what_the_rest_asks():
    assert families.names()[:3] == ("dspark", "dflash", "eagle3")
    for name in ("dspark", "dflash", "eagle3"):
        family = families.get(name)
        assert family.training_forward is not None and family.vllm_checks is not None
    assert families.get("dspark").gguf_refusal is None
    assert "speculators format" in families.get("eagle3").gguf_refusal
    # DSpark and DFlash share one backbone; DFlash takes no head options.
    assert families.get("dspark").model_class is families.get("dflash").model_class
    assert "markov_rank" in families.get("dspark").init_options
    assert "markov_rank" not in families.get("dflash").init_options
