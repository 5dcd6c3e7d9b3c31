"""Decoding: `generate` one prompt, `bench` methods side by side, `calibrate` the confidence head, `plot` a result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dspark.cli.app import (
    ConfidenceThresholdOption,
    CostModelOption,
    DType,
    DTypeOption,
    PromptLookupOption,
    TargetOption,
    app,
    device_name,
    encode_text,
    fail,
    parse_ids,
    torch_dtype,
)
from dspark.defaults import DEFAULT_DRAFT_TOKENS
from dspark.errors import DSparkError


@app.command("generate")
def generate_cmd(
    prompt: Annotated[str, typer.Option(help="Prompt text.")],
    target: TargetOption = None,
    draft: Annotated[Path | None, typer.Option(help="Drafter directory (default: the embedded one).")] = None,
    method: Annotated[
        str,
        typer.Option(
            help="auto (the --draft checkpoint's family, or the embedded DSpark drafter), baseline, ngram, or "
            "a drafter family: dspark, dflash, eagle3."
        ),
    ] = "auto",
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Tokens to generate.")] = 128,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy; > 0 = rejection sampling.")] = 0.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus filter (1.0 = off).")] = 1.0,
    top_k: Annotated[int, typer.Option(min=0, help="Top-k filter (0 = off).")] = 0,
    seed: Annotated[int, typer.Option(help="Seed of the sampling generator.")] = 0,
    num_speculative_tokens: Annotated[
        int | None,
        typer.Option(help=f"Drafts verified per step (default: min({DEFAULT_DRAFT_TOKENS}, drafts per block))."),
    ] = None,
    confidence_threshold: ConfidenceThresholdOption = None,
    cost_model: CostModelOption = None,
    prompt_lookup: PromptLookupOption = None,
    check_lossless: Annotated[
        bool, typer.Option(help="Also run plain greedy decoding and compare token by token (exit 1 on mismatch).")
    ] = False,
    chat: Annotated[bool, typer.Option(help="Wrap the prompt in the tokenizer's chat template, if it has one.")] = True,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "cpu",
    dtype: DTypeOption = DType.auto,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
) -> None:
    """Generate text with speculative decoding and report acceptance and speed."""
    from dspark import families
    from dspark.decoding.factory import Drafting
    from dspark.decoding.generate import generate_report
    from dspark.decoding.sampling import SamplingParams
    from dspark.defaults import resolve_draft, resolve_target
    from dspark.target import TargetModel

    try:
        if top_p <= 0.0:
            raise DSparkError("--top-p must be in (0, 1]")
        checkpoint = method == "auto" or method in families.names()
        draft_dir = resolve_draft(draft, "dspark" if method == "auto" else method) if checkpoint else None
        if cost_model == "off":  # serve's word for the fixed length, which is generate's default
            cost_model = None
        drafting = Drafting(method, draft_dir, confidence_threshold, cost_model, prompt_lookup).resolved()
        dev = device_name(device)
        tgt = TargetModel.from_pretrained(resolve_target(target), device=dev, dtype=torch_dtype(dtype, dev))
        report = generate_report(
            tgt,
            drafting,
            encode_text(tgt, prompt, chat),
            max_new_tokens=max_new_tokens,
            params=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p),
            seed=seed,
            num_speculative_tokens=num_speculative_tokens,
            check_lossless=check_lossless,
        )
        report["dtype"] = str(tgt.dtype).removeprefix("torch.")  # what --dtype (auto by default) chose
    except (DSparkError, ValueError) as exc:
        fail(str(exc))
    lossless = report["lossless"]
    if as_json:
        typer.echo(json.dumps(report))
    else:
        typer.echo(report["text"] if report["text"] is not None else report["tokens"])
        typer.echo(
            f"\n[{report['method']} k={report['num_speculative_tokens']}] accept_len {report['accept_len']:.3f} | "
            f"{report['tokens_per_second']:.1f} tok/s | {report['target_forwards']} target forwards | {report['dtype']}"
            + ("" if lossless is None else f" | lossless {lossless}"),
            err=True,
        )
    if lossless is False:
        typer.echo("error: speculative output differs from plain greedy decoding", err=True)
        raise typer.Exit(1)


@app.command("bench")
def bench_cmd(
    target: TargetOption = None,
    draft: Annotated[Path | None, typer.Option(help="Drafter directory (default: the embedded one).")] = None,
    datasets: Annotated[
        str, typer.Option(help="Comma list: gsm8k, math500, aime24, humaneval, spec_bench (or spec_bench/CATEGORY).")
    ] = "gsm8k,humaneval",
    rows: Annotated[int, typer.Option(min=1, help="Prompts per dataset.")] = 8,
    methods: Annotated[
        str,
        typer.Option(
            help="Comma list of baseline, ngram, dspark, dflash, eagle3, or LABEL=PATH (any drafter "
            "checkpoint). A DSpark entry may end in @T (truncate blocks at confidence survival T), "
            "@cost (draft length from this machine's measured step cost) or @cost=FILE. A drafter name "
            "or path followed by +ngram (before any @) drafts by prompt lookup first (dspark+ngram@cost)."
        ),
    ] = "baseline,ngram,dspark",
    draft_dflash: Annotated[
        Path | None, typer.Option(help="DFlash drafter for method dflash (default: the embedded one).")
    ] = None,
    draft_eagle3: Annotated[
        Path | None, typer.Option(help="EAGLE-3 drafter for method eagle3 (default: the embedded one).")
    ] = None,
    n: Annotated[str, typer.Option(help="Comma list of draft lengths.")] = "3,7",
    max_new_tokens: Annotated[int, typer.Option(min=1, help="New tokens per prompt.")] = 128,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy (losslessness checked per row).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Write JSON results with provenance here.")] = None,
    markdown: Annotated[Path | None, typer.Option(help="Write the markdown table here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a per-position acceptance plot (PNG) here.")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or auto.")] = "cpu",
    dtype: DTypeOption = DType.auto,
) -> None:
    """Speculative decoding benchmark in the model card's format; methods interleaved in one run."""
    from dspark.bench.provenance import finished, provenance, write_json
    from dspark.bench.speculative import acceptance_plot, markdown_table, parse_methods, require_matplotlib, run_bench
    from dspark.defaults import resolve_target
    from dspark.target import TargetModel

    try:
        if plot:
            require_matplotlib()  # before the run, not after it
        specs = parse_methods(methods, {"dspark": draft, "dflash": draft_dflash, "eagle3": draft_eagle3})
        names = [d for d in datasets.split(",") if d]
        ns = parse_ids(n, "--n") or [DEFAULT_DRAFT_TOKENS]
        target_dir = resolve_target(target)
        dev = device_name(device)
        compute = torch_dtype(dtype, dev)
        meta = provenance(  # before the run: the code and tree that produce the rows
            seed,
            target=str(target_dir),
            drafters={s.label: str(s.drafting.draft) for s in specs if s.drafting.draft},
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            rows=rows,
            dtype=str(compute).removeprefix("torch."),
        )
        tgt = TargetModel.from_pretrained(target_dir, device=dev, dtype=compute)
        result_rows = run_bench(
            tgt,
            datasets=names,
            methods=specs,
            ns=ns,
            rows=rows,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
        )
    except (DSparkError, ValueError) as exc:
        fail(str(exc))
    table = markdown_table(result_rows)
    typer.echo(table)
    if out:
        write_json(out, {"provenance": finished(meta), "rows": result_rows})
    if markdown:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(table)
    if plot:
        try:
            acceptance_plot(result_rows, plot)
        except DSparkError as exc:
            fail(str(exc))
    if any(r["lossless"] is False for r in result_rows):
        typer.echo("error: a greedy row differs from the baseline (see lossless in the table)", err=True)
        raise typer.Exit(1)


@app.command()
def calibrate(
    target: TargetOption = None,
    draft: Annotated[Path | None, typer.Option(help="DSpark drafter directory (default: the embedded one).")] = None,
    datasets: Annotated[str, typer.Option(help="Comma list of benchmark sets (held out from training).")] = (
        "gsm8k,humaneval"
    ),
    rows: Annotated[
        int, typer.Option(min=2, help="Prompts per dataset (even ones fit Platt scaling, odd score it).")
    ] = 8,
    n: Annotated[int, typer.Option(min=1, help="Draft length.")] = DEFAULT_DRAFT_TOKENS,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="New tokens per prompt.")] = 128,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy verification.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    bins: Annotated[int, typer.Option(min=2, help="Equal-width confidence bins for ECE.")] = 10,
    out: Annotated[Path | None, typer.Option(help="Write the JSON report (with provenance) here.")] = None,
    markdown: Annotated[Path | None, typer.Option(help="Write the markdown table here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the reliability diagram (PNG) here.")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or auto.")] = "cpu",
) -> None:
    """Confidence-head calibration in real decoding: ECE, AUROC, Brier per position."""
    from dspark.bench.calibration import calibration_markdown, calibration_report, collect_records, reliability_plot
    from dspark.bench.provenance import finished, provenance, write_json
    from dspark.bench.speculative import require_matplotlib
    from dspark.defaults import resolve_draft, resolve_target
    from dspark.target import TargetModel

    try:
        if plot:
            require_matplotlib()
        draft_dir = resolve_draft(draft, "dspark")
        target_dir = resolve_target(target)
        meta = provenance(  # before the run: the code and tree that produce the report
            seed,
            target=str(target_dir),
            draft=str(draft_dir),
            datasets=datasets,
            rows=rows,
            n=n,
            bins=bins,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
        )
        tgt = TargetModel.from_pretrained(target_dir, device=device_name(device))
        per_prompt = collect_records(
            tgt,
            draft_dir,
            datasets=[d for d in datasets.split(",") if d],
            rows=rows,
            n=n,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
        )
        report = calibration_report(per_prompt, n, bins)
    except (DSparkError, ValueError) as exc:
        fail(str(exc))
    table = calibration_markdown(report)
    typer.echo(table)
    if out:
        write_json(out, {"provenance": finished(meta), **report})
    if markdown:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(table)
    if plot:
        reliability_plot(report, plot)


@app.command()
def plot(
    results: Annotated[
        Path, typer.Argument(help="A JSON file written by `dspark bench --out` or `dspark calibrate --out`.")
    ],
    out: Annotated[Path, typer.Option("--out", help="PNG to write.")],
    methods: Annotated[str | None, typer.Option(help="Comma list of method labels to keep (default: all).")] = None,
    n: Annotated[str | None, typer.Option(help="Comma list of draft lengths to keep (default: all).")] = None,
) -> None:
    """Re-draw a plot from saved results (no re-run): a bench's per-position acceptance, or a
    calibrate report's reliability diagram."""
    from dspark.bench.calibration import reliability_plot
    from dspark.bench.speculative import acceptance_plot

    try:
        data = json.loads(results.read_text())
        if isinstance(data, dict) and "positions" in data and "rows" not in data:
            reliability_plot(data, out)
            typer.echo(f"wrote {out}")
            return
        rows = data["rows"]
        keep_m = set(methods.split(",")) if methods else None
        keep_n = set(parse_ids(n, "--n")) if n else None
        rows = [r for r in rows if (keep_m is None or r["method"] in keep_m) and (keep_n is None or r["n"] in keep_n)]
        if not rows:
            raise DSparkError(f"{results}: no rows match --methods/--n")
        acceptance_plot(rows, out)
    except FileNotFoundError:
        fail(f"{results}: no such file")
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        fail(f"{results}: not a `dspark bench --out` or `dspark calibrate --out` JSON file ({exc})")
    except DSparkError as exc:
        fail(str(exc))
    typer.echo(f"wrote {out}")
