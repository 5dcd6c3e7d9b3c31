"""scripts/scaling_report.py: the saved drafters it scores beside the runs (`--drafter
LABEL:ROWS=DIR`) and the per-slot table's conditional acceptance."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("scaling_report", ROOT / "scripts" / "scaling_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_saved_drafter_takes_its_steps_from_its_training_summary(report, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "TRAINING.json").write_text(json.dumps({"steps": 4000}))
    row = report.extra_drafter(f"dspark (672 rows, before):672={tmp_path}")
    assert row == {"method": "dspark (672 rows, before)", "rows": 672, "steps": 4000, "path": tmp_path, "saved": True}
    (tmp_path / "TRAINING.json").unlink()
    assert report.extra_drafter(f"old:10={tmp_path}")["steps"] is None


@pytest.mark.parametrize("spec", ["dspark=DIR", "dspark:many=DIR", ":12=DIR", "dspark:0=DIR", "dspark:12"])
def test_a_malformed_drafter_spec_names_the_expected_form(report, spec):
    with pytest.raises(SystemExit, match="expected LABEL:ROWS=DIR"):
        report.extra_drafter(spec)


def test_a_directory_without_a_drafter_is_named(report, tmp_path):
    with pytest.raises(SystemExit, match="holds no drafter"):
        report.extra_drafter(f"x:5={tmp_path}")


def test_per_slot_acceptance_is_conditional_on_the_slot_before(report):
    # P(slot j accepted) falls 0.5, 0.25, 0.0: each slot given the one before passes half, then none.
    assert report.conditional([0.5, 0.25, 0.0, 0.0]) == [0.5, 0.5, 0.0, None]
