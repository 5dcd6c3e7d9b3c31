"""`dspark bench` on a tiny target: the table's shape, JSON schema and the losslessness check."""

import json

from typer.testing import CliRunner

from dspark.cli import app

runner = CliRunner()


def test_bench_writes_the_card_table_and_json(tiny_target_dirs, tmp_path):
    draft = tmp_path / "draft"
    assert runner.invoke(app, ["init", "--target", str(tiny_target_dirs["qwen3"]), "--out", str(draft)]).exit_code == 0
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    result = runner.invoke(
        app,
        [
            "bench",
            "--target",
            str(tiny_target_dirs["qwen3"]),
            "--draft",
            str(draft),
            "--datasets",
            "gsm8k,aime24",
            "--rows",
            "2",
            "--n",
            "3,7",
            "--max-new-tokens",
            "16",
            "--out",
            str(out),
            "--markdown",
            str(md),
            "--plot",
            str(tmp_path / "acceptance.png"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(out.read_text())
    assert report["provenance"]["commit"] is None or len(report["provenance"]["commit"]) == 40
    from dspark.devices import compute_dtype

    # The dtype the run computed in (the default, auto, resolved for this CPU), not the word "auto".
    assert report["provenance"]["dtype"] == str(compute_dtype("auto")).removeprefix("torch.")
    rows = report["rows"]
    assert {(r["dataset"], r["method"], r["n"]) for r in rows} >= {("gsm8k", "dspark", 7), ("aime24", "ngram", 3)}
    for r in rows:
        for key in (
            "dataset",
            "method",
            "n",
            "prompts",
            "accept_len",
            "tokens_per_second",
            "speedup",
            "lossless",
            "per_position_acceptance",
        ):
            assert key in r
        assert r["prompts"] == 2
        assert r["lossless"] is True
    assert "| gsm8k | 2 |" in md.read_text()
    assert "baseline tok/s" in result.stdout
    assert "Each cell is `tok/s / speedup / accept_len`" in result.stdout  # the legend, printed and saved
    assert "accept_len: tokens emitted per target verification forward" in md.read_text()
    # the plot again from the saved JSON, filtered; filters that keep nothing are an error
    png = tmp_path / "replot.png"
    replot = runner.invoke(app, ["plot", str(out), "--out", str(png), "--methods", "dspark", "--n", "7"])
    assert replot.exit_code == 0, replot.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    empty = runner.invoke(app, ["plot", str(out), "--out", str(png), "--methods", "eagle3"])
    assert empty.exit_code != 0 and "no rows match" in empty.output
    md_as_json = runner.invoke(app, ["plot", str(md), "--out", str(png)])
    assert (
        md_as_json.exit_code != 0
        and "not a `dspark bench --out` or `dspark calibrate --out` JSON file" in md_as_json.output
    )


def test_bench_plot_without_matplotlib_fails_before_running(tiny_target_dirs, tmp_path, monkeypatch):
    import dspark.bench.speculative as spec
    from dspark.errors import DSparkError

    def missing():
        raise DSparkError("--plot needs matplotlib")

    def must_not_run(*args, **kwargs):
        raise AssertionError("the benchmark ran although --plot cannot be written")

    monkeypatch.setattr(spec, "require_matplotlib", missing)
    monkeypatch.setattr(spec, "run_bench", must_not_run)
    result = runner.invoke(
        app, ["bench", "--target", str(tiny_target_dirs["qwen3"]), "--plot", str(tmp_path / "p.png")]
    )
    assert result.exit_code != 0
    assert "--plot needs matplotlib" in result.output


def test_bench_compares_peers_in_one_run(tiny_target_dirs, tmp_path):
    """dspark, dflash and eagle3 checkpoints (plus a labelled one) side by side, all lossless."""
    target = str(tiny_target_dirs["llama"])
    for method in ("dspark", "dflash", "eagle3"):
        made = runner.invoke(app, ["init", "--target", target, "--out", str(tmp_path / method), "--method", method])
        assert made.exit_code == 0, made.output
        assert f"untrained {method} drafter" in made.output
    out = tmp_path / "bench.json"
    result = runner.invoke(
        app,
        [
            "bench",
            "--target",
            target,
            "--methods",
            f"dspark,dflash,eagle3,conf={tmp_path / 'dspark'}@0.5,dspark@cost",
            "--draft",
            str(tmp_path / "dspark"),
            "--draft-dflash",
            str(tmp_path / "dflash"),
            "--draft-eagle3",
            str(tmp_path / "eagle3"),
            "--datasets",
            "gsm8k",
            "--rows",
            "1",
            "--n",
            "3",
            "--max-new-tokens",
            "12",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["baseline", "dspark", "dflash", "eagle3", "conf", "dspark@cost"]
    assert all(r["lossless"] is True for r in rows)
    cost = rows[-1]["step_cost"]  # measured on this machine before the timed loop, kept with the row
    assert len(cost["verify_seconds"]) == 9 and cost["draft_seconds"] > 0  # block 8: 1..9 tokens
    assert "step_cost" not in rows[1] and rows[-1]["drafts_per_step"] <= 3
    assert all(r["tokens"] == rows[0]["tokens"] for r in rows)
    assert "eagle3 n=3" in result.stdout
    # a wrong pairing is named, not run
    bad = runner.invoke(
        app, ["bench", "--target", target, "--methods", "eagle3", "--draft-eagle3", str(tmp_path / "dspark")]
    )
    assert bad.exit_code != 0 and "holds a dspark drafter, not a eagle3 one" in bad.output
    # a draft length the drafter cannot draft is an error, not a column labelled n=99 that drafts fewer
    for n, message in (("99", "dspark drafts at most"), ("0", "draft lengths must be >= 1")):
        wrong = runner.invoke(
            app, ["bench", "--target", target, "--methods", "dspark", "--draft", str(tmp_path / "dspark"), "--n", n]
        )
        assert wrong.exit_code == 2 and message in wrong.output, wrong.output


def test_provenance_outside_a_git_checkout_names_the_given_commit(monkeypatch):
    """A copied tree (no .git) records DSPARK_SOURCE_COMMIT and an unknown, not a clean, state."""
    import subprocess as sp

    from dspark.bench import provenance as prov

    monkeypatch.setattr(prov.subprocess, "run", lambda *a, **k: sp.CompletedProcess(a, 128, stdout="", stderr=""))
    monkeypatch.delenv("DSPARK_SOURCE_COMMIT", raising=False)
    assert (prov.provenance()["commit"], prov.provenance()["dirty"]) == (None, None)
    monkeypatch.setenv("DSPARK_SOURCE_COMMIT", "a" * 40)
    assert (prov.provenance()["commit"], prov.provenance()["dirty"]) == ("a" * 40, None)


def test_methods_with_prompt_lookup_parse_and_run(tiny_target_dirs, tmp_path):
    """`+ngram[N]` after a drafter name or path: prompt lookup first, the drafter otherwise."""
    import pytest

    from dspark.bench.speculative import parse_methods
    from dspark.errors import DSparkError

    target = str(tiny_target_dirs["llama"])
    draft = tmp_path / "dspark"
    assert runner.invoke(app, ["init", "--target", target, "--out", str(draft)]).exit_code == 0
    specs = parse_methods(f"dspark+ngram@cost,dspark+ngram2,mine={draft}+ngram@0.5,dspark", {"dspark": draft})
    got = [
        (s.label, s.method, s.drafting.prompt_lookup, s.drafting.cost_model, s.drafting.confidence_threshold)
        for s in specs[1:]
    ]
    assert got == [
        ("dspark+ngram@cost", "dspark", 3, "auto", None),
        ("dspark+ngram2", "dspark", 2, None, None),
        ("mine", "dspark", 3, None, 0.5),
        ("dspark", "dspark", None, None, None),
    ]
    assert specs[2].drafting.draft == draft and specs[3].drafting.draft == draft
    for bad in ("ngram+ngram", "dspark+ngram0", "dspark+ngramx", "dspark@cost+ngram"):
        with pytest.raises(DSparkError):
            parse_methods(bad, {"dspark": draft})
    out = tmp_path / "bench.json"
    result = runner.invoke(
        app,
        ["bench", "--target", target, "--draft", str(draft), "--methods", "dspark,dspark+ngram", "--datasets",
         "humaneval", "--rows", "1", "--n", "3", "--max-new-tokens", "16", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["baseline", "dspark", "dspark+ngram"]
    assert all(r["lossless"] is True for r in rows)
    assert "lookup_share" not in rows[1] and 0.0 <= rows[2]["lookup_share"] <= 1.0
    assert "draft_lookup" in rows[2]["timings"]
    # prompt lookup wraps a drafter checkpoint; it is not an option of plain or n-gram decoding
    wrong = runner.invoke(
        app, ["generate", "--target", target, "--method", "ngram", "--prompt", "hi", "--prompt-lookup", "3"]
    )
    assert wrong.exit_code != 0 and "--prompt-lookup wraps a drafter checkpoint" in wrong.output
    made = runner.invoke(
        app,
        [
            "generate",
            "--target",
            target,
            "--draft",
            str(draft),
            "--prompt",
            "a b a b a b",
            "--max-new-tokens",
            "8",
            "--prompt-lookup",
            "2",
            "--check-lossless",
            "--json",
        ],
    )
    assert made.exit_code == 0, made.output
    report = json.loads(made.stdout.strip().splitlines()[-1])
    assert report["method"] == "dspark+ngram" and report["lossless"] is True and "lookup_steps" in report


def test_bench_takes_provenance_before_the_run(tiny_target_dirs, tmp_path, monkeypatch):
    """A commit made while a long bench runs must not be credited with its rows."""
    import dspark.bench.provenance as prov
    import dspark.bench.speculative as spec

    order = []
    real_prov, real_run = prov.provenance, spec.run_bench
    monkeypatch.setattr(prov, "provenance", lambda *a, **k: order.append("provenance") or real_prov(*a, **k))
    monkeypatch.setattr(spec, "run_bench", lambda *a, **k: order.append("run") or real_run(*a, **k))
    out = tmp_path / "bench.json"
    target = str(tiny_target_dirs["llama"])
    result = runner.invoke(
        app,
        ["bench", "--target", target, "--methods", "ngram", "--datasets", "gsm8k", "--rows", "1",
         "--max-new-tokens", "4", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert order == ["provenance", "run"]
    meta = json.loads(out.read_text())["provenance"]
    assert meta["time_utc"] <= meta["finished_utc"]
