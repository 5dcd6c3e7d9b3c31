"""Score the scaling-curve runs on the corpus's held-out split and write the curve.

    python scripts/scaling_report.py [--out docs/results/scaling-smollm2-cpu]

Reads .cache/corpus-train/scale/<method>-<N>/final (scripts/scaling_curve.sh) and the full
runs .cache/corpus-train/run-<method>/final (scripts/train_default_drafter.sh), scores them
all on the same held-out rows and blocks (`dspark evaluate`: teacher forced, n=7, 32 blocks a
row, the target in fp32, run once per row for every drafter), and writes OUT.json (with
provenance), OUT.md (the table) and OUT.png (accept_len against train rows, log scale). Per
method it fits accept_len = a + b·log2(rows) and says how many rows that line needs to reach
accept_len 2.5; a straight line in log(rows) is an extrapolation, so treat it as a guide. A
run of several epochs is its own point, beside the one-epoch curve. A second table gives
each run's per-slot acceptance given the slot before it was accepted (slot 1: the first
draft), where drafters that draft a block in one pass (DFlash) and those that condition each
draft on the one before (DSpark's Markov head, EAGLE-3) differ. `--render JSON` writes the
tables, plot and JSON again from a scored JSON without scoring anything.

`--drafter LABEL:ROWS=DIR` (repeatable) scores a saved drafter too, e.g. a shipped one in
models/ or an earlier one from git history (`git archive COMMIT models | tar -x -C DIR`):
ROWS is the train rows it saw, its steps come from DIR/TRAINING.json when it has one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from pathlib import Path

C = Path(".cache/corpus-train")
METHODS = ("dspark", "dflash", "eagle3")
GOAL = 2.5
FP32 = " (fp32-target features)"  # the check that bf16-target features cost no acceptance


def runs() -> list[dict]:
    found = []
    for method in METHODS:
        full = C / f"run-{method}" / "final"
        if full.is_dir():
            recipe = json.loads((C / f"run-{method}" / "recipe.json").read_text())
            data = Path(recipe["data"]) if Path(recipe["data"]).is_file() else C / "train.jsonl"
            with open(data) as fh:
                rows = sum(1 for line in fh if line.strip())
            rows = min(rows, recipe["train"].get("max_examples") or rows)
            steps = recipe["train"]["steps"]  # one row a step
            # The curve is one epoch per size: a run of several epochs is its own point.
            label = method if steps == rows else f"{method} ({steps / rows:.3g} epochs)"
            found.append({"method": label, "rows": int(rows), "steps": steps, "path": full})
        for d in sorted((C / "scale").glob(f"{method}-*")):
            m = re.fullmatch(rf"{method}-(\d+)(-fp32features)?", d.name)
            if m and (d / "final").is_dir():
                label = method + (FP32 if m.group(2) else "")
                found.append({"method": label, "rows": int(m.group(1)), "steps": int(m.group(1)), "path": d / "final"})
    return sorted(found, key=lambda r: (r["method"], r["rows"]))


def extra_drafter(spec: str) -> dict:
    """``LABEL:ROWS=DIR`` as a row of runs(): a saved drafter scored beside the runs."""
    head, sep, path = spec.partition("=")
    label, _, rows = head.rpartition(":")
    if not sep or not label or not rows.isdigit() or int(rows) < 1:
        raise SystemExit(
            f"--drafter {spec!r}: expected LABEL:ROWS=DIR, e.g. 'dspark (shipped):35355=models/smollm2-135m-dspark'"
        )
    d = Path(path)
    if not (d / "config.json").is_file():
        raise SystemExit(f"--drafter {spec!r}: {d} holds no drafter (no config.json)")
    summary = d / "TRAINING.json"
    steps = json.loads(summary.read_text()).get("steps") if summary.is_file() else None
    # Its data may be another corpus's (an earlier drafter's): no token count from this export.
    return {"method": label, "rows": int(rows), "steps": steps, "path": d, "saved": True}


def fit(points: list[tuple[int, float]]) -> dict | None:
    if len(points) < 2:
        return None
    xs = [math.log2(r) for r, _ in points]
    ys = [a for _, a in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    need = 2 ** ((GOAL - a) / b) if b > 0 else None
    return {"intercept": a, "per_doubling": b, f"rows_for_{GOAL}": need}


def conditional(unconditional: list[float]) -> list[float | None]:
    """P(slot j accepted | slot j - 1 accepted) from P(slot j accepted) (the evaluation's
    ``per_position_acceptance``, whose sum is accept_len - 1)."""
    out, before = [], 1.0
    for p in unconditional:
        out.append(p / before if before > 0 else None)
        before = p
    return out


def score(found: list[dict]) -> tuple[list[dict], dict]:
    """Every run on the same held-out rows and blocks: the table's rows and their provenance."""
    from tqdm import tqdm

    from dspark.bench.provenance import finished, provenance
    from dspark.defaults import default_target_dir
    from dspark.formats.convert import open_drafter
    from dspark.target import TargetModel
    from dspark.training.data import load_examples
    from dspark.training.evaluate import simulated_accept_len_many

    held = load_examples(C / "heldout.jsonl", max_len=512)
    train = [json.loads(line) for line in (C / "train.jsonl").open()]
    meta = provenance(0, heldout_rows=len(held), n=7, anchors_per_row=32)
    target = TargetModel.from_pretrained(default_target_dir())
    models = [open_drafter(r["path"], target=target) for r in found]
    with tqdm(total=len(held), desc="evaluate", unit="row") as bar:
        reports = simulated_accept_len_many(
            models, target, held, max_anchors=32, num_drafts=7, seed=0, on_example=bar.update
        )
    rows = []
    for r, rep in zip(found, reports, strict=True):
        rows.append(
            {
                "method": r["method"],
                "train_rows": r["rows"],
                "assistant_tokens": None if r.get("saved") else sum(sum(x["loss_mask"]) for x in train[: r["rows"]]),
                "steps": r["steps"],
                "heldout_accept_len": rep["sim_accept_len"],
                "per_position_acceptance": rep["per_position_acceptance"],
                "blocks": rep["blocks"],
                "run": str(r["path"]),
            }
        )
    return rows, finished(meta)


def relabel(rows: list[dict], found: list[dict]) -> list[dict]:
    """A scored JSON's rows with each run's label and steps as its recipe says now (the scores
    are kept): before the fix beside this function a run of several epochs was written with
    one epoch's steps."""
    by_path = {str(r["path"]): r for r in found}
    return [
        {**x, "method": by_path[x["run"]]["method"], "steps": by_path[x["run"]]["steps"]} if x["run"] in by_path else x
        for x in rows
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="docs/results/scaling-smollm2-cpu")
    p.add_argument(
        "--drafter",
        action="append",
        default=[],
        metavar="LABEL:ROWS=DIR",
        help="also score this saved drafter (repeatable); ROWS: the train rows it saw",
    )
    p.add_argument(
        "--render", metavar="JSON", help="write OUT's table, plot and JSON from this scored JSON, scoring nothing"
    )
    a = p.parse_args()
    os.chdir(Path(__file__).resolve().parent.parent)
    from dspark.bench.provenance import write_json

    found = runs() + [extra_drafter(spec) for spec in a.drafter]
    if a.render:
        scored = json.loads(Path(a.render).read_text())
        rows, meta = relabel(scored["rows"], found), scored["provenance"]
    elif not found:
        raise SystemExit("no runs found: run scripts/train_default_drafter.sh and scripts/scaling_curve.sh first")
    else:
        rows, meta = score(found)
    fits = {m: fit([(x["train_rows"], x["heldout_accept_len"]) for x in rows if x["method"] == m]) for m in METHODS}
    out = Path(a.out)
    write_json(out.with_suffix(".json"), {"provenance": meta, "rows": rows, "fits": fits})
    sizes = sorted({x["train_rows"] for x in rows})
    lines = [
        "| method | " + " | ".join(f"{s:,} rows" for s in sizes) + f" | + per doubling | rows for {GOAL} (fit) |",
        "| --- | " + " | ".join("---" for _ in sizes) + " | --- | --- |",
    ]
    labels = sorted({x["method"] for x in rows}, key=lambda m: (m not in METHODS, m))
    for m in labels:
        cells = {x["train_rows"]: x["heldout_accept_len"] for x in rows if x["method"] == m}
        if not cells:
            continue
        f = fits.get(m)  # None for a single point (the fp32-features check, a run of several epochs)
        slope = f"{f['per_doubling']:+.3f}" if f else "—"
        need = f"{f[f'rows_for_{GOAL}']:,.0f}" if f and f[f"rows_for_{GOAL}"] else "—"
        lines.append(
            f"| {m} | " + " | ".join(f"{cells[s]:.3f}" if s in cells else "" for s in sizes) + f" | {slope} | {need} |"
        )
    slots = max(len(x["per_position_acceptance"]) for x in rows)
    lines += [
        "",
        "Per slot: P(slot j accepted | slot j − 1 accepted), held out, teacher forced:",
        "",
        "| method | train rows | steps | " + " | ".join(f"slot {j + 1}" for j in range(slots)) + " |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in range(slots)) + " |",
    ]
    for x in sorted(rows, key=lambda x: (labels.index(x["method"]), x["train_rows"])):
        cells = ["" if c is None else f"{c:.3f}" for c in conditional(x["per_position_acceptance"])]
        steps = "" if x["steps"] is None else f"{x['steps']:,}"
        lines.append(f"| {x['method']} | {x['train_rows']:,} | {steps} | " + " | ".join(cells) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for m in METHODS:
        pts = [(x["train_rows"], x["heldout_accept_len"]) for x in rows if x["method"] == m]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=m)
    for m in labels:  # runs of several epochs, saved drafters: single points beside the curves
        pts = [(x["train_rows"], x["heldout_accept_len"]) for x in rows if x["method"] == m]
        if m not in METHODS and FP32 not in m:
            ax.plot(*zip(*pts, strict=True), marker="*", markersize=12, linestyle="none", label=m)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("train rows (lines: one epoch each; stars: several epochs or saved drafters)")
    ax.set_ylabel("held-out teacher-forced accept_len (n=7)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
