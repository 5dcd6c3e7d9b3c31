"""`dspark train --config A --config B`: several drafters trained on one pass of the target
learn exactly what each learns alone, resume on their own, and refuse recipes that cannot
share their features."""

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_train_cli import write_recipe
from test_training import WORDS
from typer.testing import CliRunner

from dspark.cli import app
from dspark.errors import ConfigError, DSparkError
from dspark.training.datagen import self_distill
from dspark.training.recipe import load_recipe
from dspark.training.run import run_training
from dspark.training.together import check_shared, train_together

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tiny_targets, tmp_path_factory):
    path = tmp_path_factory.mktemp("together-data") / "train.jsonl"
    self_distill(
        tiny_targets["qwen3"], [" ".join(WORDS[i : i + 2]) for i in range(10)], path, max_new_tokens=24, progress=False
    )
    return path


def two_recipes(tmp_path, target, data, tag):
    a = write_recipe(tmp_path / f"a-{tag}.yaml", target, data, tmp_path / f"a-{tag}")
    b = write_recipe(tmp_path / f"b-{tag}.yaml", target, data, tmp_path / f"b-{tag}", max_anchors=8, lr=2e-3)
    raw = yaml.safe_load(b.read_text())
    raw["drafter"] = {"method": "dflash", "layers": 1}
    b.write_text(yaml.safe_dump(raw))
    return a, b


def test_together_learns_what_each_learns_alone_and_resumes_on_its_own(tiny_target_dirs, data, tmp_path):
    target = tiny_target_dirs["qwen3"]
    alone = two_recipes(tmp_path, target, data, "alone")
    together = two_recipes(tmp_path, target, data, "together")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the trainer processes
    try:
        for path in alone:
            run_training(load_recipe(path), progress=False)
        # DSpark gets a head start of 3 steps (a checkpoint), DFlash starts from nothing: the
        # shared source starts at row 0 and the DSpark trainer skips the rows it has done.
        run_training(load_recipe(together[0]), progress=False, stop_after=3)
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "a-together" / "checkpoints" / "step_0000003").is_dir()
    args = ["train", "--config", str(together[0]), "--config", str(together[1]), "--no-progress"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["step"] for line in result.stdout.strip().splitlines()] == [6, 6]
    for tag in ("a", "b"):
        mine = load_file(str(tmp_path / f"{tag}-together" / "final" / "model.safetensors"))
        ref = load_file(str(tmp_path / f"{tag}-alone" / "final" / "model.safetensors"))
        assert mine.keys() == ref.keys()
        for name in ref:
            torch.testing.assert_close(mine[name], ref[name], rtol=1e-5, atol=1e-6, msg=f"{tag}: {name}")
        log, ref_log = (
            [json.loads(line) for line in (tmp_path / f"{tag}-{kind}" / "train_log.jsonl").read_text().splitlines()]
            for kind in ("together", "alone")
        )
        assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
        for r, s in zip(log, ref_log, strict=True):
            assert r["loss"] == pytest.approx(s["loss"], rel=1e-5)
    # The trained DSpark and DFlash differ: each trainer trained its own drafter.
    assert json.loads((tmp_path / "b-together" / "final" / "config.json").read_text())["markov_rank"] in (0, None)


def test_recipes_that_cannot_share_features_are_refused(tiny_target_dirs, data, tmp_path):
    target = tiny_target_dirs["qwen3"]
    a, b = two_recipes(tmp_path, target, data, "x")
    ra, rb = load_recipe(a), load_recipe(b)
    with pytest.raises(ConfigError, match=r"train\.steps is 7"):
        check_shared([ra, load_recipe(b, ["train.steps=7"])], ["a", "b"])
    with pytest.raises(ConfigError, match="data is"):
        check_shared([ra, load_recipe(b, [f"data={tmp_path / 'other.jsonl'}"])], ["a", "b"])
    with pytest.raises(ConfigError, match="both write to"):
        check_shared([ra, load_recipe(b, [f"out={ra.out}"])], ["a", "b"])
    with pytest.raises(ConfigError, match="two or more"):
        check_shared([ra], ["a"])
    check_shared([ra, rb], ["a", "b"])
    result = runner.invoke(app, ["train", "--config", str(a), "--config", str(b), "--set", "train.steps=0"])
    assert result.exit_code == 2 and "train.steps must be positive" in result.output


def test_a_trainer_that_fails_or_reads_other_layers_stops_the_run_by_name(tiny_target_dirs, data, tmp_path):
    target = tiny_target_dirs["qwen3"]
    a, b = two_recipes(tmp_path, target, data, "bad")
    raw = yaml.safe_load(b.read_text())
    raw["drafter"]["vocab"] = str(tmp_path / "missing-vocab.safetensors")
    b.write_text(yaml.safe_dump(raw))
    with pytest.raises(DSparkError, match=r"b-bad\.yaml.*missing-vocab"):
        train_together([load_recipe(a), load_recipe(b)], [str(a), str(b)], progress=False)
    raw["drafter"] = {"method": "dflash", "layers": 1, "aux_layers": [0, 1]}
    b.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="aux layers"):
        train_together([load_recipe(a), load_recipe(b)], [str(a), str(b)], progress=False)
    assert not (tmp_path / "a-bad" / "final").exists()
