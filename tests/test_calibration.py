"""Confidence-head calibration: the metrics on known inputs, and `dspark calibrate` end to end."""

import json
import random

import pytest
from typer.testing import CliRunner

from dspark.bench.calibration import _apply_platt, auroc, brier, calibration_report, ece, fit_platt
from dspark.cli import app

runner = CliRunner()


def test_auroc_counts_ordered_pairs_and_ties():
    assert auroc([0.1, 0.2, 0.8, 0.9], [False, False, True, True]) == 1.0
    assert auroc([0.9, 0.8, 0.2, 0.1], [False, False, True, True]) == 0.0
    # one tie between a positive and a negative counts half: pairs (0.5+, 0.5-)=0.5, (0.5+, 0.1-)=1
    assert auroc([0.5, 0.5, 0.1], [True, False, False]) == pytest.approx(0.75)
    assert auroc([0.3, 0.4], [True, True]) is None


def test_ece_and_brier_on_known_bins():
    # bin [0.2, 0.3): conf 0.25 twice, both accepted -> gap 0.75; bin [0.9, 1]: conf 0.95, rejected -> 0.95
    scores, labels = [0.25, 0.25, 0.95], [True, True, False]
    assert ece(scores, labels) == pytest.approx((2 * 0.75 + 0.95) / 3)
    assert brier(scores, labels) == pytest.approx((0.75**2 * 2 + 0.95**2) / 3)
    assert ece([0.5] * 4, [True, False, True, False]) == pytest.approx(0.0)


def test_platt_scaling_fixes_an_overconfident_head():
    rng = random.Random(0)
    true_p = [rng.random() for _ in range(4000)]
    labels = [rng.random() < p for p in true_p]
    overconfident = [min(0.999, 0.3 + 0.7 * p) for p in true_p]  # says >= 0.3 always
    a, b = fit_platt(overconfident, labels)
    assert ece(_apply_platt(overconfident, a, b), labels) < 0.5 * ece(overconfident, labels)


def test_report_splits_prompts_for_platt():
    per_prompt = [("gsm8k", i, [(0, 0.9, i % 3 == 0), (1, 0.2, False)]) for i in range(6)]
    report = calibration_report(per_prompt, n=2)
    first = report["positions"][0]
    assert first["count"] == 6 and first["platt"]["fit_count"] == 3 and first["platt"]["heldout_count"] == 3
    assert report["positions"][1]["auroc"] is None  # one class only
    assert report["overall"]["count"] == 12


def test_calibrate_cli_on_a_tiny_drafter(tiny_target_dirs, tmp_path):
    target = str(tiny_target_dirs["llama"])
    for method in ("dspark", "dflash"):
        made = runner.invoke(app, ["init", "--target", target, "--out", str(tmp_path / method), "--method", method])
        assert made.exit_code == 0, made.output
    out, png = tmp_path / "calib.json", tmp_path / "rel.png"
    common = ["--target", target, "--datasets", "gsm8k", "--rows", "2", "--n", "3", "--max-new-tokens", "12"]
    result = runner.invoke(
        app, ["calibrate", *common, "--draft", str(tmp_path / "dspark"), "--out", str(out), "--plot", str(png)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["provenance"]["n"] == 3
    assert [p["position"] for p in report["positions"]] == [1, 2, 3]
    assert report["positions"][0]["count"] > 0  # every verification reaches slot 1
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "| position k |" in result.stdout
    replot = runner.invoke(app, ["plot", str(out), "--out", str(tmp_path / "again.png")])
    assert replot.exit_code == 0, replot.output
    assert (tmp_path / "again.png").read_bytes()[:4] == b"\x89PNG"
    no_head = runner.invoke(app, ["calibrate", *common, "--draft", str(tmp_path / "dflash")])
    assert no_head.exit_code != 0 and "no confidence head" in no_head.output
