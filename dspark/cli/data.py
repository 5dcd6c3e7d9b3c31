"""Data: self-distillation (`datagen`; the corpus commands are `dspark corpus`), the pruned vocab, the feature cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark.cli.app import DType, TargetOption, app, fail, parse_ids, torch_dtype
from dspark.errors import DSparkError


@app.command("datagen")
def datagen_cmd(
    prompts: Annotated[Path, typer.Option(help="JSONL prompts (messages, prompt, question, problem or turns field).")],
    out: Annotated[Path, typer.Option(help="JSONL output; existing rows are kept and skipped (resume).")],
    target: TargetOption = None,
    field: Annotated[str | None, typer.Option(help="Prompt field to read (default: auto-detect).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Use only the first N prompts.")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Response length cap.")] = 256,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy responses.")] = 0.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus filter when sampling.")] = 1.0,
    batch_size: Annotated[int, typer.Option(min=1, help="Prompts per static batch (generate engine).")] = 8,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    dtype: Annotated[
        DType,
        typer.Option(
            help="Compute dtype. bfloat16 is ~1.6-2x faster on CPUs with AVX512-BF16 or AMX, but its greedy text "
            "can differ from the float32 target's."
        ),
    ] = DType.float32,
    engine: Annotated[
        str,
        typer.Option(
            help="auto: continuous batching (slots) where the target allows, else generate; or slots, generate."
        ),
    ] = "auto",
    slots: Annotated[int, typer.Option(min=1, help="Sequences decoded together (slots engine).")] = 64,
    server: Annotated[
        str | None,
        typer.Option(
            help="URL of an OpenAI-compatible server that answers instead (vLLM, dspark serve); prompts go as "
            "token ids, answers come back as token ids (vLLM's return_token_ids). --target gives the tokenizer."
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight with --server.")] = 16,
    model: Annotated[str | None, typer.Option(help="Model name for --server (default: its first model).")] = None,
) -> None:
    """Regenerate responses with the target itself (self-distillation), tokenized with a loss mask."""
    from dspark.defaults import resolve_target
    from dspark.target import TargetModel
    from dspark.target.prompts import encode_prompt
    from dspark.training.datagen import ServerEngine, make_engine, read_prompts, self_distill

    try:
        rows = read_prompts(prompts, field)[:limit]
        if server:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(resolve_target(target)))
            gen = ServerEngine(
                server,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=seed,
                concurrency=concurrency,
                model=model,
            )
            n = self_distill(None, rows, out, engine=gen, tokenizer=tok)
            typer.echo(f"wrote {n} new rows to {out} ({len(rows)} prompts in all; answered by {gen.name})")
            return
        tgt = TargetModel.from_pretrained(resolve_target(target), dtype=torch_dtype(dtype))
        longest = max((len(encode_prompt(tgt.tokenizer, p)) for p in rows), default=1)
        gen = make_engine(
            engine,
            tgt,
            slots=slots,
            batch_size=batch_size,
            max_prompt_len=longest,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            log=lambda m: typer.echo(m, err=True),
        )
        n = self_distill(tgt, rows, out, engine=gen)
    except DSparkError as exc:
        fail(str(exc))
    typer.echo(f"wrote {n} new rows to {out} ({len(rows)} prompts in all)")


@app.command("vocab")
def vocab_cmd(
    data: Annotated[Path, typer.Option(help="Training JSONL from `dspark datagen`.")],
    size: Annotated[int, typer.Option(min=1, help="Draft vocab size.")],
    out: Annotated[Path, typer.Option(help="Output .safetensors with d2t (int64 offsets) and t2d (bool).")],
    target: TargetOption = None,
) -> None:
    """Build d2t/t2d from assistant-token frequencies (ties broken by lower id)."""
    from safetensors.torch import save_file

    from dspark.defaults import resolve_target
    from dspark.model.vocab import draft_to_target_ids, mapping_from_counts
    from dspark.target import TargetModel
    from dspark.training.data import assistant_token_counts, load_examples

    try:
        if out.exists():
            raise DSparkError(f"{out}: exists; refusing to overwrite it")
        tgt = TargetModel.from_pretrained(resolve_target(target))
        counts = assistant_token_counts(load_examples(data), tgt.vocab_size)
        if size > tgt.vocab_size:
            raise DSparkError(f"--size {size} exceeds the target vocab ({tgt.vocab_size})")
        d2t, t2d = mapping_from_counts(counts, size)
    except DSparkError as exc:
        fail(str(exc))
    save_file({"d2t": d2t, "t2d": t2d}, str(out))
    covered = counts[draft_to_target_ids(d2t)].sum() / counts.sum().clamp_min(1)
    typer.echo(f"wrote {out}: {size} draft ids covering {float(covered):.2%} of assistant tokens")


@app.command("cache-features")
def cache_features_cmd(
    data: Annotated[Path, typer.Option(help="Training JSONL from `dspark datagen`.")],
    out: Annotated[Path, typer.Option(help="Cache directory (resumes when it already holds shards).")],
    aux_layers: Annotated[str, typer.Option(help="Comma-separated aux layer ids of the drafter to train.")],
    target: TargetOption = None,
    seq_len: Annotated[int, typer.Option(min=2, help="Truncate examples to this many tokens.")] = 2048,
    shard_size: Annotated[int, typer.Option(min=1, help="Examples per shard.")] = 64,
    target_dtype: Annotated[
        DType, typer.Option(help="Dtype the target runs in (bfloat16: ~1.8x faster on CPUs with AVX512-BF16).")
    ] = DType.float32,
    workers: Annotated[int, typer.Option(min=1, help="Processes computing shards (one torch thread each).")] = 1,
) -> None:
    """Precompute target features (aux layers + final state) into checksummed safetensors shards."""
    from dspark.defaults import resolve_target
    from dspark.target import TargetModel
    from dspark.training.data import load_examples
    from dspark.training.feature_cache import build_feature_cache

    try:
        target_dir = resolve_target(target)
        tgt = TargetModel.from_pretrained(target_dir, dtype=torch_dtype(target_dtype))
        ids = parse_ids(aux_layers, "--aux-layers")
        tgt.check_layer_ids(ids)
        examples = load_examples(data, max_len=seq_len)
        build_feature_cache(
            tgt,
            examples,
            ids,
            out,
            shard_size=shard_size,
            workers=workers,
            target_dir=target_dir,
            data=data,
            max_len=seq_len,
        )
    except DSparkError as exc:
        fail(str(exc))
    typer.echo(str(out))
