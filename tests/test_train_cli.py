"""`dspark train` from YAML, `dspark vocab`, `dspark inspect`, 2-process DDP == 1 process, and
several recipes trained together on one pass of the target == each alone."""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file
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
    path = tmp_path_factory.mktemp("cli-data") / "train.jsonl"
    self_distill(
        tiny_targets["qwen3"], [" ".join(WORDS[i : i + 2]) for i in range(12)], path, max_new_tokens=32, progress=False
    )
    return path


def write_recipe(path, target, data, out, **train):
    recipe = {
        "target": str(target),
        "data": str(data),
        "out": str(out),
        "source": "inprocess",
        "drafter": {"layers": 1, "markov_rank": 16},
        "train": {
            "steps": 6,
            "lr": 1e-3,
            "warmup": 2,
            "max_anchors": 16,
            "seq_len": 128,
            "checkpoint_every": 3,
            **train,
        },
    }
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_train_from_yaml_then_inspect(tiny_target_dirs, data, tmp_path):
    cfg = write_recipe(tmp_path / "run.yaml", tiny_target_dirs["qwen3"], data, tmp_path / "run")
    result = runner.invoke(app, ["train", "--config", str(cfg), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["step"] == 6
    # what the run computes in, said before it starts (stderr)
    said = f"{tmp_path / 'run'}: the target computes features in float32 (inprocess); training steps in float32 on cpu"
    assert said in result.stderr
    result = runner.invoke(app, ["inspect", str(tmp_path / "run" / "final"), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    # 22 tensors in the model; a full-vocab checkpoint stores no d2t/t2d (as speculators), so 20 in the file
    assert info["tensors"] == 20 and info["config"]["markov_rank"] == 16
    assert info["format"] == "speculators" and info["valid"]


def test_snapshot_writes_a_stage_checkpoint_as_the_drafter_the_run_ends_with(tiny_target_dirs, data, tmp_path):
    from safetensors.torch import load_file

    cfg = write_recipe(tmp_path / "run.yaml", tiny_target_dirs["qwen3"], data, tmp_path / "run")
    result = runner.invoke(app, ["train", "--config", str(cfg), "--no-progress"])
    assert result.exit_code == 0, result.output
    # Without a bar, a status line at each checkpoint (for logs of background runs).
    assert "run: step 3/6 (50.0%), loss " in result.stderr and "run: step 6/6 (100.0%)" in result.stderr
    run = tmp_path / "run"
    result = runner.invoke(app, ["snapshot", str(run), "--out", str(tmp_path / "last")])
    assert result.exit_code == 0, result.output
    assert "step 6" in result.stdout
    final, last = (
        load_file(str(run / "final" / "model.safetensors")),
        load_file(str(tmp_path / "last" / "model.safetensors")),
    )
    assert final.keys() == last.keys() and all(torch.equal(final[k], last[k]) for k in final)
    assert runner.invoke(app, ["snapshot", str(run), "--out", str(tmp_path / "s3"), "--step", "3"]).exit_code == 0
    early = load_file(str(tmp_path / "s3" / "model.safetensors"))
    assert any(not torch.equal(early[k], final[k]) for k in final)
    result = runner.invoke(
        app,
        [
            "evaluate",
            "--data",
            str(data),
            "--rows",
            "2",
            "--draft",
            str(tmp_path / "s3"),
            "--target",
            str(tiny_target_dirs["qwen3"]),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    # Clear refusals; nothing is overwritten.
    result = runner.invoke(app, ["snapshot", str(run), "--out", str(tmp_path / "last")])
    assert result.exit_code != 0 and "exists" in result.output
    result = runner.invoke(app, ["snapshot", str(run), "--out", str(tmp_path / "s4"), "--step", "4"])
    assert result.exit_code != 0 and "no checkpoint of step 4 (kept: 3, 6)" in result.output
    result = runner.invoke(app, ["snapshot", str(tmp_path), "--out", str(tmp_path / "x")])
    assert result.exit_code != 0 and "not a training run" in result.output
    state = run / "checkpoints" / "step_0000003" / "state.pt"
    state.write_bytes(state.read_bytes()[:-10])
    result = runner.invoke(app, ["snapshot", str(run), "--out", str(tmp_path / "y"), "--step", "3"])
    assert result.exit_code != 0 and "checksum mismatch" in result.output and not (tmp_path / "y").exists()


def test_unknown_config_keys_are_errors(tiny_target_dirs, data, tmp_path):
    cfg = write_recipe(tmp_path / "bad.yaml", tiny_target_dirs["qwen3"], data, tmp_path / "bad", learning_rate=1.0)
    result = runner.invoke(app, ["train", "--config", str(cfg)])
    assert result.exit_code == 2 and "unknown train key" in result.output
    raw = yaml.safe_load(cfg.read_text())
    raw["train"].pop("learning_rate")
    raw["optimiser"] = "sgd"
    cfg.write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["train", "--config", str(cfg)])
    assert result.exit_code == 2 and "unknown key" in result.output


def test_preset_inspect_matches_the_model_card():
    result = runner.invoke(app, ["inspect", "--preset", "kimi-k2.7-code", "--json", "--shapes"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["tensors"] == 44
    assert abs(info["parameters"] - 3.15e9) < 0.01e9
    assert abs(info["bytes"] - 6.3e9) < 0.02e9
    shapes = info["tensor_shapes"]
    assert shapes["embed_tokens.weight"]["shape"] == [163840, 7168]
    assert shapes["lm_head.weight"]["shape"] == [32000, 7168]
    assert shapes["markov_head.markov_w1.weight"]["shape"] == [163840, 256]
    assert shapes["confidence_head.proj.weight"]["shape"] == [1, 7168 + 256]
    assert shapes["d2t"]["dtype"] == "int64" and shapes["t2d"]["dtype"] == "bool"


def test_vocab_command_and_pruned_training(tiny_target_dirs, data, tmp_path):
    out = tmp_path / "vocab.safetensors"
    result = runner.invoke(
        app,
        ["vocab", "--data", str(data), "--size", "64", "--out", str(out), "--target", str(tiny_target_dirs["qwen3"])],
    )
    assert result.exit_code == 0, result.output
    tables = load_file(str(out))
    assert tables["d2t"].shape == (64,) and tables["t2d"].sum() == 64
    again = runner.invoke(
        app,
        ["vocab", "--data", str(data), "--size", "64", "--out", str(out), "--target", str(tiny_target_dirs["qwen3"])],
    )
    assert again.exit_code == 2 and "refusing to overwrite" in again.output
    cfg = write_recipe(tmp_path / "p.yaml", tiny_target_dirs["qwen3"], data, tmp_path / "p")
    raw = yaml.safe_load(cfg.read_text())
    raw["drafter"]["vocab"] = str(out)
    cfg.write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["train", "--config", str(cfg), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "p" / "final" / "config.json").read_text())["draft_vocab_size"] == 64


def test_two_process_ddp_matches_one_process(tiny_target_dirs, data, tmp_path):
    single = write_recipe(tmp_path / "one.yaml", tiny_target_dirs["qwen3"], data, tmp_path / "one", grad_accum=2)
    double = write_recipe(tmp_path / "two.yaml", tiny_target_dirs["qwen3"], data, tmp_path / "two", grad_accum=1)
    assert runner.invoke(app, ["train", "--config", str(single), "--no-progress"]).exit_code == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            "29517",
            "-m",
            "dspark.cli",
            "train",
            "--config",
            str(double),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
    steps = [json.loads(line)["step"] for line in (tmp_path / "two" / "train_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_shipped_recipes_parse_and_peers_share_everything_but_the_model():
    """The peer and ablation recipes differ from the DSpark one only in the drafter they build."""
    import dataclasses
    from pathlib import Path

    from dspark.training.recipe import load_recipe

    root = Path(__file__).resolve().parent.parent / "recipes"
    ref = load_recipe(root / "smollm2-135m-dspark.yaml")
    others = [
        root / "smollm2-135m-dflash.yaml",
        root / "smollm2-135m-eagle3.yaml",
        *sorted(root.glob("ablations/*.yaml")),
    ]
    assert [p.stem for p in others[2:]] == [
        "smollm2-135m-dflash-3layer",
        "smollm2-135m-dspark-3layer",
        "smollm2-135m-dspark-noconf",
        "smollm2-135m-dspark-r256",
    ]
    outs = {ref.out}
    for path in others:
        r = load_recipe(path)
        assert (r.target, r.data, r.source, r.cache) == (ref.target, ref.data, ref.source, ref.cache), path
        assert dataclasses.asdict(r.train) == dataclasses.asdict(ref.train), path
        assert r.drafter["vocab"] == ref.drafter["vocab"] and r.drafter["aux_layers"] == ref.drafter["aux_layers"]
        assert r.drafter != ref.drafter, path
        outs.add(r.out)
    assert len(outs) == len(others) + 1  # no two runs share an output directory


def test_recipe_overrides(tmp_path):
    """`dspark train --set`: typed values, sections, cwd-relative paths, clear errors."""
    from pathlib import Path

    from dspark.errors import ConfigError
    from dspark.training.recipe import load_recipe

    recipe = Path(__file__).resolve().parent.parent / "recipes" / "smollm2-135m-dspark.yaml"
    r = load_recipe(recipe, ["train.steps=123", "train.max_examples=50", f"out={tmp_path}/x", "drafter.markov_rank=8"])
    assert r.train.steps == 123 and r.train.max_examples == 50 and r.out == tmp_path / "x"
    assert r.drafter["markov_rank"] == 8 and r.train.lr == 1.0e-3
    with pytest.raises(ConfigError, match="unknown train key"):
        load_recipe(recipe, ["train.stepz=1"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_recipe(recipe, ["train.steps"])
    with pytest.raises(ConfigError, match="max_examples must be positive"):
        load_recipe(recipe, ["train.max_examples=0"])
    # Where it trains, and the final drafter's dtype.
    r = load_recipe(recipe, ["device=cuda:1", "train.save_dtype=bfloat16"])
    assert r.device == "cuda:1" and r.train.save_dtype == "bfloat16" and load_recipe(recipe).device == "cpu"
    with pytest.raises(ConfigError, match="device must be cpu, cuda, cuda:N or auto, got 'gpu'"):
        load_recipe(recipe, ["device=gpu"])
    with pytest.raises(ConfigError, match="save_dtype must be float32 or bfloat16"):
        load_recipe(recipe, ["train.save_dtype=float16"])
    if not torch.cuda.is_available():
        from dspark.devices import device_name
        from dspark.errors import DSparkError

        assert device_name("auto") == "cpu" and device_name("cpu") == "cpu"
        with pytest.raises(DSparkError, match="no CUDA device"):
            device_name("cuda", rank=0)


def test_recipe_vllm_source_needs_a_url(tmp_path):
    from pathlib import Path

    from dspark.errors import ConfigError
    from dspark.training.recipe import load_recipe

    recipe = Path(__file__).resolve().parent.parent / "recipes" / "smollm2-135m-dspark.yaml"
    with pytest.raises(ConfigError, match="source: vllm needs vllm"):
        load_recipe(recipe, ["source=vllm"])
    with pytest.raises(ConfigError, match="unknown vllm key"):
        load_recipe(recipe, ["source=vllm", "vllm.url=http://127.0.0.1:8000", "vllm.urls=x"])
    r = load_recipe(recipe, ["source=vllm", "vllm.url=http://127.0.0.1:8000", "vllm.concurrency=2"])
    assert r.source == "vllm" and r.vllm == {"url": "http://127.0.0.1:8000", "concurrency": 2}


@pytest.mark.filterwarnings("ignore::dspark.devices.EmulatedBFloat16Warning")  # bf16 on purpose, on any CPU
def test_recipe_target_dtype_picks_the_features_dtype(tiny_target_dirs, data, tmp_path):
    """target_dtype: the sources that run the target compute in it; the drafter's own copy of
    the target's weights stays fp32; sources that compute elsewhere refuse it."""
    from dspark.errors import ConfigError
    from dspark.target import TargetModel
    from dspark.training.recipe import load_recipe
    from dspark.training.run import build_source

    cfg = write_recipe(tmp_path / "r.yaml", tiny_target_dirs["qwen3"], data, tmp_path / "r")
    assert load_recipe(cfg).target_dtype == "float32"
    recipe = load_recipe(cfg, ["target_dtype=bfloat16"])
    fp32 = TargetModel.from_pretrained(recipe.target)
    source = build_source(recipe, (0, 1), fp32)
    assert source.target.dtype == torch.bfloat16 and fp32.dtype == torch.float32
    assert build_source(load_recipe(cfg), (0, 1), fp32).target is fp32
    online = build_source(load_recipe(cfg, ["source=online", "target_dtype=bfloat16"]), (0, 1))
    assert online.args[-2:] == ("bfloat16", 1)  # dtype, and the worker's one torch thread by default
    two = build_source(load_recipe(cfg, ["source=online", "target_threads=2"]), (0, 1))
    assert two.args[-1] == 2 and two.workers == 1
    assert build_source(load_recipe(cfg, ["source=online", "target_workers=3"]), (0, 1)).workers == 3
    with pytest.raises(ConfigError, match="target_workers must be an integer >= 1"):
        load_recipe(cfg, ["source=online", "target_workers=0"])
    with pytest.raises(ConfigError, match="target_workers applies to source: online"):
        load_recipe(cfg, ["source=inprocess", "target_workers=2"])
    with pytest.raises(ConfigError, match="target_threads must be an integer >= 1"):
        load_recipe(cfg, ["source=online", "target_threads=0"])
    with pytest.raises(ConfigError, match="target_threads applies to source: online"):
        load_recipe(cfg, ["source=inprocess", "target_threads=2"])
    with pytest.raises(ConfigError, match="target_dtype must be one of"):
        load_recipe(cfg, ["target_dtype=float16"])
    with pytest.raises(ConfigError, match="a cache records its own dtype"):
        load_recipe(cfg, ["source=offline", f"cache={tmp_path}", "target_dtype=bfloat16"])


def test_recipe_auto_dtypes_follow_what_the_machine_computes_natively(tiny_target_dirs, data, tmp_path, monkeypatch):
    """target_dtype: auto and train.autocast_bf16: auto pick bf16 only where the device computes
    it natively; an explicit bf16 where it is emulated (8-14x slower on an AVX2 CPU) warns."""
    import warnings

    import dspark.devices
    from dspark.devices import EmulatedBFloat16Warning

    cfg = write_recipe(tmp_path / "r.yaml", tiny_target_dirs["qwen3"], data, tmp_path / "r")
    for native, dtype in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(dspark.devices, "native_bfloat16", lambda device, native=native: native)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # auto never warns
            r = load_recipe(cfg, ["source=online", "target_dtype=auto", "train.autocast_bf16=auto"])
        assert (r.target_dtype, r.train.autocast_bf16) == (dtype, native)
        # offline and vllm sources run no target here: auto is float32, the cache records its own
        assert load_recipe(cfg, ["source=offline", f"cache={tmp_path}", "target_dtype=auto"]).target_dtype == "float32"
        explicit = ["source=online", "target_dtype=bfloat16", "train.autocast_bf16=true"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = load_recipe(cfg, explicit)
        assert (r.target_dtype, r.train.autocast_bf16) == ("bfloat16", True)  # as asked, either way
        said = [str(w.message) for w in caught if w.category is EmulatedBFloat16Warning]
        if native:
            assert said == []
        else:
            assert [m.split(":")[0] for m in said] == ["target_dtype", "train.autocast_bf16"]
            assert "'auto' picks float32 here" in said[0]
    with pytest.raises(ConfigError, match="autocast_bf16 must be true, false or auto, got 'yes please'"):
        load_recipe(cfg, ["train.autocast_bf16=yes please"])


def test_shipped_recipes_autocast_where_bf16_is_native(monkeypatch):
    """The shipped recipes ask for bf16 autocast as auto: on where native (as they were trained),
    off on a CPU that emulates bf16."""
    from pathlib import Path

    import dspark.devices

    recipe = Path(__file__).resolve().parent.parent / "recipes" / "smollm2-135m-dspark.yaml"
    for native in (True, False):
        monkeypatch.setattr(dspark.devices, "native_bfloat16", lambda device, native=native: native)
        assert load_recipe(recipe).train.autocast_bf16 is native


# ---- several recipes on one pass of the target (`dspark train --config A --config B`): they learn
# exactly what each learns alone, resume on their own, and refuse recipes that cannot share features.


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
