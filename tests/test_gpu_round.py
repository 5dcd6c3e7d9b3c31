"""scripts/gpu_round.sh end to end at toy size on the CPU (DEVICE=cpu): the new rows form
their own corpus, the peers train on everything, the archive comes back in parts, and
unpacking merges the rows without repeating one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from dspark.cli import app
from dspark.corpus import Corpus, is_heldout, prompt_key
from dspark.devices import dtype_name

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def _prompts(count: int) -> list[str]:
    """``count`` prompts, the first of them in the held-out split (so the round scores on it)."""
    held = next(f"question {i}" for i in range(10_000) if is_heldout(prompt_key(f"question {i}")))
    return [held] + [f"prompt {i}: {'word ' * (i % 5)}" for i in range(count - 1)]


def test_gpu_round_at_toy_size_on_cpu(tiny_target_dirs, tmp_path):
    target = tiny_target_dirs["llama"]
    pool = tmp_path / "pool.jsonl"
    pool.write_text(
        "".join(json.dumps({"prompt": p, "source": "s", "source_index": i}) + "\n" for i, p in enumerate(_prompts(12)))
    )
    corpus = tmp_path / "corpus"
    grown = runner.invoke(
        app,
        ["corpus", "grow", "--corpus", str(corpus), "--prompts", str(pool), "--work", str(tmp_path / "w.jsonl"),
         "--target", str(target), "--limit", "5", "--slots", "4", "--max-new-tokens", "8", "--dtype", "float32"],
    )  # fmt: skip
    assert grown.exit_code == 0, grown.output
    before = {r.prompt_key: r.input_ids for r in Corpus(corpus).iter_rows()}
    assert len(before) == 5

    env = {
        **os.environ,
        "PY": sys.executable,
        "DEVICE": "cpu",
        "TARGET": str(target),
        "CORPUS": str(corpus),
        "POOL": str(pool),
        "WORK": str(tmp_path / "round"),
        "GEN_LIMIT": "4",
        "SLOTS": "4",
        "MAX_NEW_TOKENS": "8",
        "STEPS": "2",
        "METHODS": "dspark eagle3",
        "VOCAB_SIZE": "64",
        "EVAL_ROWS": "4",
        "RECIPE_SET": "drafter.aux_layers=[0,1,3] train.seq_len=64 train.max_anchors=4 train.autocast_bf16=false",
        "OMP_NUM_THREADS": "1",
    }
    out = tmp_path / "out"
    run = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_round.sh"), "run", str(out)],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    parts = sorted(out.glob("round.tgz.part-*"))
    assert 1 <= len(parts) <= 8 and all(p.stat().st_size <= 15 * 2**20 for p in parts)
    summary = json.loads((tmp_path / "round" / "round.json").read_text())
    assert summary["new_rows"] == 4 and summary["train_failed"] == []
    for method in ("dspark", "eagle3"):
        assert summary["methods"][method]["last_log"]["step"] == 2
        assert summary["methods"][method]["heldout_teacher_forced_accept_len"] >= 1.0
    # The stored rows were never answered again: the round's corpus holds only new prompts.
    new = Corpus(tmp_path / "round" / "new-corpus")
    assert not {r.prompt_key for r in new.iter_rows()} & set(before)
    # --dtype auto: bf16 where this CPU computes it natively, else fp32 (as the rows record)
    assert {r.engine for r in new.iter_rows()} == {f"dspark-slots/{dtype_name('auto')}"}
    # The peers trained on all 9 rows' train split; the corpus itself is untouched by `run`.
    assert Corpus(corpus).rows == 5

    back = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_round.sh"), "unpack", str(out)],
        check=False, cwd=ROOT, env={**env, "WORK": str(tmp_path / "here")}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    merged = Corpus(corpus)
    merged.verify()
    rows = {r.prompt_key: r.input_ids for r in merged.iter_rows()}
    assert merged.rows == 9 and len(rows) == 9
    assert all(rows[k] == ids for k, ids in before.items())
    for method in ("dspark", "eagle3"):
        final = tmp_path / "here" / "returned" / f"run-{method}" / "final"
        assert (final / "config.json").is_file() and (final / "model.safetensors").is_file()
    # Merging the same rows again adds nothing.
    again = runner.invoke(app, ["corpus", "merge", str(corpus), "--from", str(tmp_path / "here/returned/new-corpus")])
    assert again.exit_code == 0 and "'added': 0" in again.output and Corpus(corpus).rows == 9
