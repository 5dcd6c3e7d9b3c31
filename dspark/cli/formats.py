"""Formats: `inspect` a drafter file, `export` to speculators or GGUF, `import` from other tools."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from dspark.cli.app import app, fail
from dspark.errors import DSparkError


class SourceKind(str, Enum):
    speculators = "speculators"
    gguf = "gguf"
    dflash = "dflash"
    deepspec = "deepspec"


class ExportFormat(str, Enum):
    speculators = "speculators"
    gguf = "gguf"


@app.command("inspect")
def inspect_cmd(
    path: Annotated[
        Path | None, typer.Argument(help="Drafter to validate and describe: a directory or a .gguf file.")
    ] = None,
    preset: Annotated[str | None, typer.Option(help="Describe a named preset instead (meta device).")] = None,
    source: Annotated[
        SourceKind | None,
        typer.Option("--from", help="Format of PATH (default: .gguf file -> gguf, directory -> speculators)."),
    ] = None,
    target: Annotated[
        Path | None, typer.Option(help="Check the drafter against this target directory too (vocab, sizes, layers).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    shapes: Annotated[bool, typer.Option(help="Include every tensor's shape and dtype.")] = False,
) -> None:
    """Validate a drafter (config fields, tensor shapes, d2t/t2d, mask token) and describe it."""
    from dspark.formats.convert import describe_path
    from dspark.formats.inspect import describe_config
    from dspark.training.presets import preset_config

    try:
        if (path is None) == (preset is None):
            raise DSparkError("give either a drafter PATH or --preset NAME")
        if preset:
            info = describe_config(preset_config(preset))
        else:
            info = describe_path(path, kind=source.value if source else None, target=target)
    except DSparkError as exc:
        fail(str(exc))
    if not shapes:
        info.pop("tensor_shapes")
    if as_json:
        typer.echo(json.dumps(info))
    else:
        typer.echo(
            f"{info['method']}: {info['tensors']} tensors, {info['parameters'] / 1e9:.3f} B parameters "
            f"({info['trainable_parameters'] / 1e9:.3f} B trainable), {info['bytes'] / 1e9:.3f} GB "
            f"({info['float_dtype']})" + (f", {info['format']} format, valid" if "format" in info else "")
        )


@app.command("export")
def export_cmd(
    draft: Annotated[Path, typer.Argument(help="Drafter to export: a directory (ours / speculators) or a .gguf.")],
    out: Annotated[Path, typer.Option(help="Output directory (speculators) or .gguf file.")],
    fmt: Annotated[ExportFormat, typer.Option("--format", help="speculators (vLLM, speculators) or gguf (llama.cpp).")],
    outtype: Annotated[
        str | None,
        typer.Option(
            help="Tensor type. GGUF: f32, f16 (default), bf16, q8_0, q4_0, q4_1, q5_0, q5_1; "
            "speculators: f32, bf16 (default) or f16."
        ),
    ] = None,
    target: Annotated[
        Path | None,
        typer.Option(help="Target directory: its embedding goes into the GGUF, its layer count is checked."),
    ] = None,
    tokenizer_from: Annotated[
        Path | None,
        typer.Option(
            help="Copy the GGUF tokenizer from this target .gguf (default: build it from the target's tokenizer.json)."
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON report.")] = False,
) -> None:
    """Write a drafter as a speculators checkpoint or as a llama.cpp draft-dspark GGUF."""

    from dspark.defaults import resolve_target
    from dspark.formats.convert import export_drafter

    try:
        target_dir = resolve_target(target) if (target is not None or fmt == ExportFormat.gguf) else None
        report = export_drafter(
            draft,
            fmt.value,
            out,
            target_dir=target_dir,
            outtype=outtype,
            tokenizer_from=tokenizer_from,
            force=force,
            log=lambda m: typer.echo(m, err=True),
        )
    except DSparkError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(report))
    else:
        for note in report.get("notes", []):
            typer.echo(f"note: {note}", err=True)
        for item in report.get("dropped", []):
            typer.echo(f"dropped: {item}", err=True)
        typer.echo(report["path"])


@app.command("import")
def import_cmd(
    src: Annotated[Path, typer.Argument(help="Checkpoint directory written by another tool.")],
    source: Annotated[SourceKind, typer.Option("--from", help="speculators, dflash (z-lab), deepspec or gguf.")],
    out: Annotated[Path, typer.Option(help="Output directory (our format = speculators format).")],
    target: Annotated[
        Path | None, typer.Option(help="Target directory (default: the embedded one): frozen tensors, layer count.")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Read a DeepSpec / speculators / z-lab DFlash checkpoint or a GGUF into our format, validated."""
    import torch

    from dspark.defaults import resolve_target
    from dspark.formats.convert import export_speculators, fill_from_target, open_drafter
    from dspark.target.frozen import read_target_facts

    try:
        facts = read_target_facts(resolve_target(target))
        model = open_drafter(src, kind=source.value, target=facts)
        fill_from_target(model, facts)
        path = export_speculators(model, out, dtype=torch.bfloat16, force=force)
    except DSparkError as exc:
        fail(str(exc))
    cfg = model.config
    layout = f", sample_from_anchor={str(cfg.sample_from_anchor).lower()}" if hasattr(cfg, "sample_from_anchor") else ""
    typer.echo(
        f"{path}: {cfg.method}, {cfg.num_hidden_layers} layers, {cfg.drafts_per_block} drafts per step, "
        f"aux ids {list(cfg.aux_hidden_state_layer_ids)}{layout}",
    )
