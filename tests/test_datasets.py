"""The prompt sets ship inside the package: every registered set loads with nothing beside it."""

import gzip
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from dspark.datasets import REGISTRY, SPEC_BENCH_CATEGORIES, load_prompts, read_rows, training_prompts
from dspark.errors import DSparkError

# Rows per set, as dspark/datasets/README.md lists them.
EXPECTED_ROWS = {"gsm8k": 1000, "math500": 500, "aime24": 30, "humaneval": 164, "spec_bench": 480, "gsm8k_train": 7473}


def test_every_registered_set_loads_from_the_package(monkeypatch):
    monkeypatch.delenv("DSPARK_DATA", raising=False)
    assert set(REGISTRY) == set(EXPECTED_ROWS)
    for name, n in EXPECTED_ROWS.items():
        prompts = load_prompts(name)
        assert len(prompts) == n, name
        assert all(isinstance(p, str) and p.strip() for p in prompts), name
    assert len(load_prompts("gsm8k", 3)) == 3
    assert len(load_prompts("spec_bench/coding")) == 10
    assert sum(len(load_prompts(f"spec_bench/{c}")) for c in SPEC_BENCH_CATEGORIES) == 480
    assert "def " in load_prompts("humaneval", 1)[0]


def test_training_sources_refuse_benchmarks():
    assert len(training_prompts("gsm8k_train", 5)) == 5
    for name in ("gsm8k", "humaneval", "spec_bench/writing"):
        with pytest.raises(DSparkError, match="held out from training"):
            training_prompts(name)
    with pytest.raises(DSparkError, match="unknown dataset 'mbpp'"):
        load_prompts("mbpp")


def test_dspark_data_overrides_one_set_and_names_bad_files(monkeypatch, tmp_path):
    (tmp_path / "aime24.jsonl").write_text('{"problem": "mine"}\n')
    with gzip.open(tmp_path / "math500.jsonl.gz", "wt") as f:
        f.write('{"problem": "a"}\n{"problem": "b"}\n')
    monkeypatch.setenv("DSPARK_DATA", str(tmp_path))
    assert load_prompts("aime24") == ["mine"]
    assert load_prompts("math500") == ["a", "b"]
    assert len(load_prompts("gsm8k")) == 1000  # not overridden: the packaged copy
    (tmp_path / "humaneval.jsonl").write_text("{not json\n")
    with pytest.raises(DSparkError, match=r"humaneval.jsonl:1: not JSON"):
        read_rows("humaneval")
    monkeypatch.setenv("DSPARK_DATA", str(tmp_path / "missing"))
    with pytest.raises(DSparkError, match="no such folder"):
        load_prompts("gsm8k")


def test_the_built_wheel_carries_every_set(tmp_path):
    """Build the wheel, unpack it away from the source tree and load every set from it alone."""
    root, src = pathlib.Path(__file__).resolve().parents[1], tmp_path / "src"
    shutil.copytree(root / "dspark", src / "dspark", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    build = subprocess.run([*pip_wheel, "-w", str(tmp_path), str(src)], capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("dspark-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import dspark.datasets as d, pathlib, sys\n"
        "assert pathlib.Path(d.__file__).is_relative_to(sys.argv[1]), d.__file__\n"
        "print({n: len(d.load_prompts(n)) for n in d.REGISTRY})\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", probe, str(site)], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert eval(run.stdout) == EXPECTED_ROWS
