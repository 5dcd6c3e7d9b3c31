"""Build and run the server: load the target and drafter once, start the worker, hand the
app to uvicorn (loopback by default)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dspark.decoding.factory import Drafting
from dspark.defaults import DEFAULT_DRAFT_TOKENS
from dspark.errors import DSparkError


@dataclass
class ServeOptions:
    target: Path
    drafting: Drafting  # method auto: the drafter checkpoint's family
    host: str = "127.0.0.1"
    port: int = 8000
    num_speculative_tokens: int = DEFAULT_DRAFT_TOKENS
    max_concurrency: int = 16
    batch: int | None = 1  # sequences decoded together (continuous batching); 1: one at a time; None: auto
    request_timeout: float = 600.0
    max_model_len: int | None = None
    model_name: str | None = None
    shutdown_grace: float = 10.0
    dtype: torch.dtype = torch.float32
    device: str = "cpu"


AUTO_BATCH = 16  # `--batch auto` on a target the slot decoder runs


def auto_batch(target: Path) -> tuple[int, str]:
    """``--batch auto``: `AUTO_BATCH` sequences for a Hugging Face directory of a decoder the
    slot engine runs (`dspark.target.slots.MODEL_TYPES`), else 1 (one at a time); and why."""
    from dspark.target.slots import MODEL_TYPES, model_type_it_runs

    model_type = model_type_it_runs(target)
    if model_type is not None:
        return AUTO_BATCH, f"continuous batching of up to {AUTO_BATCH} requests ({model_type})"
    return 1, f"one request at a time (continuous batching runs {', '.join(MODEL_TYPES)} targets)"


def _position_limit(target) -> int:
    return int(getattr(target.config, "max_position_embeddings", 0) or 4096)


def build_app(opts: ServeOptions):
    """The FastAPI app and its worker (the worker thread is running on return)."""
    from dspark.decoding.factory import make_engine, precheck_pair
    from dspark.serve.app import ServerConfig, create_app
    from dspark.serve.metrics import Metrics
    from dspark.serve.worker import BatchWorker, Worker
    from dspark.target import TargetModel

    if opts.max_concurrency < 1:
        raise DSparkError(f"--max-concurrency must be >= 1, got {opts.max_concurrency}")
    if opts.batch is None:
        opts = replace(opts, batch=auto_batch(opts.target)[0])
    if opts.batch < 1:
        raise DSparkError(f"--batch must be >= 1, got {opts.batch}")
    if opts.batch > 1 and opts.drafting.cost_model not in (None, "auto", "off"):
        raise DSparkError(
            "--batch measures its own step cost at start-up (T(batch, tokens)); use --cost-model auto, not a saved "
            "one-sequence cost model"
        )
    if opts.request_timeout <= 0:
        raise DSparkError(f"--request-timeout must be > 0, got {opts.request_timeout}")
    speculative = opts.num_speculative_tokens > 0
    drafting = opts.drafting
    # With --batch the draft length is the load-aware rule's unless asked to stay fixed
    # ("off"): a fixed length verifies every sequence's drafts even when the batch is full.
    fixed_length = drafting.cost_model == "off"
    if fixed_length:
        drafting = replace(drafting, cost_model=None)
    if speculative and drafting.draft is None:
        raise DSparkError("--num-speculative-tokens > 0 needs a drafter (--draft)")
    if drafting.prompt_lookup is not None and not speculative:
        raise DSparkError("--prompt-lookup drafts for a drafter; it needs --num-speculative-tokens > 0")
    target_path = Path(opts.target)
    if not (target_path.is_dir() or (target_path.is_file() and target_path.suffix == ".gguf")):
        raise DSparkError(f"{target_path}: no such target directory or .gguf file")
    if speculative:  # cheap checks before the target loads; they name the family from config.json
        family = precheck_pair(target_path, drafting.draft)
        if drafting.method == "auto":
            drafting = replace(drafting, method=family)

    def load_target():
        # Runs on the worker thread: every torch op of the server stays on one thread (Worker).
        target = TargetModel.from_pretrained(opts.target, device=opts.device, dtype=opts.dtype)
        if target.tokenizer is None:
            raise DSparkError(f"{opts.target}: the target has no tokenizer; a server needs one")
        limit = _position_limit(target)
        if opts.max_model_len and opts.max_model_len > limit:
            raise DSparkError(f"--max-model-len {opts.max_model_len} exceeds the target's {limit} positions")
        return target

    def build():
        target = load_target()
        drafter = drafting.build(target) if speculative else None
        return (
            make_engine(target, drafter, opts.num_speculative_tokens if speculative else 0),
            make_engine(target, None, 0),
        )

    k = opts.num_speculative_tokens if speculative else 0

    def build_batch():
        # Runs on the worker thread. The slot cache is preallocated: --max-model-len positions
        # (default 2048) per slot, plus room for one verification block.
        from dspark.decoding.batch import BatchedEngine, Sequence
        from dspark.decoding.draft_length import LoadAwareDraftLength
        from dspark.decoding.drafters import fork_drafter
        from dspark.decoding.step_timing import measure_batch_cost
        from dspark.target.prompts import chat_prefix
        from dspark.target.slots import SlotDecoder, SlotDecoderUnsupportedError

        target = load_target()
        try:
            decoder = SlotDecoder(target.model, slots=opts.batch, max_len=batch_len(target) + k + 1)
            decoder.check()  # refuses an architecture the slot decoder does not reproduce
        except SlotDecoderUnsupportedError as exc:
            raise DSparkError(f"{exc}; serve this target one request at a time (--batch 1)") from None
        # Every chat request starts with the template's system turn: its keys and values are
        # computed once and copied into each slot at prefill.
        decoder.set_prefix(chat_prefix(target.tokenizer))
        # The batch's own draft-length rule replaces the one-sequence cost model.
        base = replace(drafting, cost_model=None).build(target) if speculative else None
        capture = tuple(base.aux_layer_ids) if base is not None else ()
        rule = None
        if speculative and not fixed_length:
            cost = measure_batch_cost(decoder, max_width=k + 1, drafter=base, capture=capture)
            rule = LoadAwareDraftLength(cost, k)
        engine = BatchedEngine(decoder, capture=capture, draft_length=rule)
        stops = target.stop_token_ids()

        def new_sequence(job) -> Sequence:
            generator = None if job.seed is None else torch.Generator().manual_seed(job.seed)
            drafter = fork_drafter(base) if job.speculative and base is not None else None
            return Sequence(
                prompt=list(job.prompt_ids),
                max_new_tokens=job.max_tokens,
                params=job.params,
                generator=generator,
                stop_ids=stops,
                drafter=drafter,
                num_speculative_tokens=k if drafter is not None else 0,
                tag=job,
            )

        return engine, new_sequence, target

    def batch_len(target) -> int:
        return opts.max_model_len or min(_position_limit(target), 2048)

    name = opts.model_name or Path(opts.target).name
    metrics = Metrics(name)

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True)  # called by the worker, after `tok` is set

    if opts.batch > 1:
        worker = BatchWorker(build_batch, decode, max_queue=opts.max_concurrency, metrics=metrics)
    else:
        worker = Worker(build, decode, max_queue=opts.max_concurrency, metrics=metrics)
    target = worker.target
    tok = target.tokenizer
    max_len = (batch_len(target) if opts.batch > 1 else None) or opts.max_model_len or _position_limit(target)
    config = ServerConfig(
        model_name=name,
        max_model_len=max_len,
        request_timeout=opts.request_timeout,
        speculative=speculative,
        num_speculative_tokens=opts.num_speculative_tokens,
        vocab_size=target.vocab_size,
        dtype=str(target.dtype).removeprefix("torch."),
        batch=opts.batch,
    )
    return create_app(worker, tok, metrics, config, shutdown_grace=opts.shutdown_grace), worker


def serve(opts: ServeOptions, log=print) -> None:
    try:
        import uvicorn
    except ImportError:  # pragma: no cover - depends on the environment
        raise DSparkError("serving needs FastAPI and uvicorn: pip install 'dspark[serve]'") from None
    if opts.batch is None:
        batch, why = auto_batch(opts.target)
        opts = replace(opts, batch=batch)
        log(f"--batch auto: {why}")
    app, _worker = build_app(opts)
    log(
        f"serving {opts.target} on http://{opts.host}:{opts.port} (speculative tokens: {opts.num_speculative_tokens}, "
        f"batch: {opts.batch})"
    )
    uvicorn.run(
        app,
        host=opts.host,
        port=opts.port,
        log_level="warning",
        timeout_graceful_shutdown=int(opts.shutdown_grace),
    )
