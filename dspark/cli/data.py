"""Data: self-distillation (`datagen`; the corpus commands are `dspark corpus`), the pruned vocab, the feature cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark.cli.app import DType, DTypeOption, TargetOption, app, fail, parse_ids, torch_dtype
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
    dtype: DTypeOption = DType.auto,
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
        DType,
        typer.Option(
            help="Dtype the target runs in (bfloat16: ~1.8x faster on CPUs with AVX512-BF16, 8-14x slower on "
            "CPUs without; auto: bfloat16 where native)."
        ),
    ] = DType.float32,
    workers: Annotated[int, typer.Option(min=1, help="Processes computing shards (one torch thread each).")] = 1,
    vllm: Annotated[
        str | None,
        typer.Option(
            help="URL of a vLLM hidden-state server (`dspark vllm-hidden-states`) that computes the features "
            "instead; the target is then loaded only for its final norm."
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight with --vllm.")] = 8,
) -> None:
    """Precompute target features (aux layers + final state) into checksummed safetensors shards."""
    from dspark.defaults import resolve_target
    from dspark.target import TargetModel
    from dspark.training.data import load_examples
    from dspark.training.feature_cache import build_feature_cache

    try:
        target_dir = resolve_target(target)
        tgt = TargetModel.from_pretrained(target_dir, dtype=torch_dtype(target_dtype, flag="--target-dtype"))
        ids = parse_ids(aux_layers, "--aux-layers")
        tgt.check_layer_ids(ids)
        examples = load_examples(data, max_len=seq_len)
        client = None
        if vllm:
            from dspark.training.vllm_source import VllmHiddenStates

            client = VllmHiddenStates(vllm, tgt, ids)
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
            vllm=client,
            vllm_concurrency=concurrency,
        )
    except DSparkError as exc:
        fail(str(exc))
    typer.echo(str(out))


@app.command("vllm-hidden-states")
def vllm_hidden_states_cmd(
    aux_layers: Annotated[str, typer.Option(help="Comma-separated aux layer ids of the drafter to train.")],
    target: TargetOption = None,
    storage: Annotated[
        Path | None, typer.Option(help="Where vLLM writes the per-request files (default: $DSPARK_CACHE/vllm-hs).")
    ] = None,
    port: Annotated[int, typer.Option(help="Port for vllm serve (loopback).")] = 8000,
    max_model_len: Annotated[int, typer.Option(min=16, help="--max-model-len: the longest example.")] = 2048,
    gpu: Annotated[
        bool, typer.Option(help="vLLM's own connector (a CUDA build); default: ours for vLLM's CPU build.")
    ] = False,
    run: Annotated[
        bool, typer.Option(help="Start it from dspark's vLLM CPU venv (installed once, 3.5 GB) and wait.")
    ] = False,
) -> None:
    """The `vllm serve` command of a hidden-state server: vLLM computes the target's features
    for `cache-features --vllm URL` or a recipe's `source: vllm`."""
    import os
    import shlex

    from dspark.defaults import cache_root, resolve_target
    from dspark.interop.vllm_env import hidden_state_server_args

    try:
        target_dir = resolve_target(target)
        ids = parse_ids(aux_layers, "--aux-layers")
        from dspark.target.frozen import read_target_shape

        shape = read_target_shape(target_dir)
        if shape is not None:
            bad = [i for i in ids if not 0 <= i <= shape.num_layers]
            if bad:
                raise DSparkError(f"--aux-layers {bad}: outside [0, {shape.num_layers}] for {target_dir}")
        layers = [*ids, shape.num_layers] if shape is not None else list(ids)
        store = storage or cache_root() / "vllm-hs"
        args = hidden_state_server_args(layers, store, cpu_connector=not gpu)
    except DSparkError as exc:
        fail(str(exc))
    if not run:
        package_root = Path(__file__).resolve().parents[2]
        env = (
            ""
            if gpu
            else f"PYTHONPATH={shlex.quote(str(package_root))} VLLM_CPU_OMP_THREADS_BIND=0-{(os.cpu_count() or 2) - 1} "
        )
        argv = ["vllm", "serve", str(target_dir), "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--max-model-len", str(max_model_len), *args]
        typer.echo(env + shlex.join(argv))
        return
    from dspark.interop.vllm_env import ensure_venv, error_excerpt, start_vllm, stop

    store.mkdir(parents=True, exist_ok=True)
    venv = ensure_venv(cache_root())
    logfile = store / "vllm-serve.log"
    proc, base, _cmd, waited = start_vllm(venv, target_dir, args, logfile, max_model_len=max_model_len, port=port)
    if proc is None:
        fail(f"vllm serve did not come up ({waited:.0f} s); {logfile}:\n{error_excerpt(logfile)}")
    typer.echo(f"vLLM hidden-state server at {base} (layers {sorted(set(layers))}; log {logfile}); Ctrl-C stops it")
    import signal

    # vLLM runs in its own process group: a SIGTERM to this command must stop it too.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop(proc)
