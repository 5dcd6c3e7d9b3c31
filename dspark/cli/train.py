"""Training and its check: `train` (a recipe), `snapshot` (a run's stage checkpoint as a drafter),
`evaluate` (teacher-forced acceptance on held-out rows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dspark.cli.app import TargetOption, app, device_name, fail
from dspark.defaults import DEFAULT_DRAFT_TOKENS
from dspark.errors import DSparkError


@app.command("train")
def train_cmd(
    config: Annotated[
        list[Path],
        typer.Option(
            help="Run description (YAML); unknown keys are errors. Repeat to train several drafters "
            "side by side on one pass of the target (one process each; the recipes must share target, "
            "data, source, seed, steps and aux layers)."
        ),
    ],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a recipe key: KEY=VALUE or SECTION.KEY=VALUE (repeatable), e.g. "
            "--set train.steps=500 --set out=runs/short (paths relative to the working directory); "
            "applies to every --config.",
        ),
    ] = None,
    threads: Annotated[
        int, typer.Option(min=1, help="Torch threads per trainer process when several --config train together.")
    ] = 1,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bar.")] = False,
) -> None:
    """Train a drafter (resumes from the last checkpoint in the run's out directory). Use torchrun for DDP."""
    from dspark.training.recipe import load_recipe
    from dspark.training.run import run_training

    try:
        recipes = [load_recipe(path, set_ or ()) for path in config]
        for recipe in recipes:  # what `auto` resolved to on this machine, before hours of it
            typer.echo(f"{recipe.out}: {precision(recipe)}", err=True)
        if len(recipes) == 1:
            results = [run_training(recipes[0], progress=not no_progress)]
        else:
            from dspark.training.together import train_together

            results = train_together(recipes, [str(p) for p in config], progress=not no_progress, threads=threads)
    except (DSparkError, ValueError) as exc:
        fail(str(exc))
    for last in results:
        typer.echo(json.dumps({k: last[k] for k in ("step", "loss", "sim_accept_len") if k in last}))


def precision(recipe) -> str:
    """Where a run's features come from and what its steps compute in, as resolved here."""
    if recipe.source == "offline":
        features = f"features from the cache {recipe.cache} (in the dtype it was built in)"
    elif recipe.source == "vllm":
        features = "features from vLLM (in its dtype)"
    else:
        features = f"the target computes features in {recipe.target_dtype} ({recipe.source})"
    step = "bf16 autocast" if recipe.train.autocast_bf16 else "float32"
    return f"{features}; training steps in {step} on {recipe.device}"


@app.command("snapshot")
def snapshot_cmd(
    run: Annotated[Path, typer.Argument(help="A training run's out directory (recipe.json, checkpoints/).")],
    out: Annotated[Path, typer.Option(help="New drafter directory to write.")],
    step: Annotated[
        int | None, typer.Option(min=0, help="The stage checkpoint's step (default: the latest kept).")
    ] = None,
) -> None:
    """Write a running (or stopped) training run's stage checkpoint as a drafter directory, to
    evaluate, bench or serve it before the run ends. The run is only read."""
    from dspark.training.run import snapshot_drafter

    try:
        path, at = snapshot_drafter(run, out, step=step)
    except DSparkError as exc:
        fail(str(exc))
    typer.echo(f"step {at} of {run} -> {path}")


@app.command("evaluate")
def evaluate_cmd(
    data: Annotated[Path, typer.Option(help="JSONL of {input_ids, loss_mask} rows, as `dspark datagen` writes.")],
    draft: Annotated[
        list[Path] | None,
        typer.Option(
            help="Drafter: dspark, dflash or eagle3 (default: the embedded DSpark). Repeat to compare "
            "several on the same rows and blocks (the target runs once per row)."
        ),
    ] = None,
    target: TargetOption = None,
    skip: Annotated[int, typer.Option(min=0, help="Leave out the first SKIP rows (e.g. the ones trained on).")] = 0,
    rows: Annotated[int, typer.Option(min=1, help="Rows to evaluate after SKIP.")] = 64,
    anchors: Annotated[int, typer.Option(min=1, help="Blocks sampled per row.")] = 32,
    n: Annotated[
        int, typer.Option(min=1, help="Draft length counted (at most the block's drafts).")
    ] = DEFAULT_DRAFT_TOKENS,
    max_len: Annotated[int, typer.Option(min=2, help="Cut each row to this many tokens.")] = 512,
    seed: Annotated[int, typer.Option(help="Anchor sampling seed.")] = 0,
    device: Annotated[str, typer.Option(help="cpu, cuda or auto.")] = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (a list when several --draft).")] = False,
) -> None:
    """Teacher-forced acceptance of a drafter on rows of a data file: a quick check before serving."""
    from tqdm import tqdm

    from dspark.defaults import resolve_draft, resolve_target
    from dspark.formats.convert import open_drafter
    from dspark.target import TargetModel
    from dspark.training.data import load_examples
    from dspark.training.evaluate import simulated_accept_len_many

    try:
        examples = load_examples(data, max_len=max_len)[skip : skip + rows]
        if not examples:
            raise DSparkError(f"{data}: no rows left after --skip {skip}")
        draft_dirs = [resolve_draft(d, "dspark") for d in (draft or [None])]
        tgt = TargetModel.from_pretrained(resolve_target(target), device=device_name(device))
        models = [open_drafter(d, target=tgt) for d in draft_dirs]
        with tqdm(total=len(examples), desc="evaluate", unit="row", disable=as_json) as bar:
            reports = simulated_accept_len_many(
                models,
                tgt,
                examples,
                max_anchors=anchors,
                num_drafts=min([n] + [m.config.drafts_per_block for m in models]),
                seed=seed,
                on_example=bar.update,
            )
    except DSparkError as exc:
        fail(str(exc))
    reports = [
        {"draft": str(d), "data": str(data), "skip": skip, "n": len(r["per_position_match"]), **r}
        for d, r in zip(draft_dirs, reports, strict=True)
    ]
    if as_json:
        typer.echo(json.dumps(reports[0] if len(reports) == 1 else reports))
        return
    for report in reports:
        typer.echo(
            f"{report['draft']}: teacher-forced accept_len {report['sim_accept_len']:.3f} over "
            f"{report['blocks']} blocks in {report['sequences']} rows"
        )
        typer.echo("slot  survive  match  tv")
        for k, (s_, m_, t_) in enumerate(
            zip(
                report["per_position_acceptance"], report["per_position_match"], report["tv_per_position"], strict=True
            ),
            1,
        ):
            typer.echo(f"{k:>4}  {s_:7.3f}  {m_:5.3f}  {t_:.3f}")
