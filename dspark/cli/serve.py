"""Serving: `serve` (OpenAI-compatible, ours) and `vllm-config` (the hand-off to vLLM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dspark.cli.app import (
    ConfidenceThresholdOption,
    DType,
    DTypeOption,
    PromptLookupOption,
    TargetOption,
    app,
    fail,
    torch_dtype,
)
from dspark.defaults import DEFAULT_DRAFT_TOKENS
from dspark.errors import DSparkError


@app.command("serve")
def serve_cmd(
    target: TargetOption = None,
    draft: Annotated[Path | None, typer.Option(help="Drafter directory or .gguf (default: the embedded one).")] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8000,
    num_speculative_tokens: Annotated[
        int, typer.Option(min=0, help="Drafts verified per step; 0 serves plain decoding.")
    ] = DEFAULT_DRAFT_TOKENS,
    max_concurrency: Annotated[
        int, typer.Option(min=1, help="Requests waiting at once (beyond those decoding); more get 429.")
    ] = 16,
    batch: Annotated[
        str,
        typer.Option(
            help="Requests decoded together (continuous batching, one target forward per step for all; with a "
            "drafter the draft length follows the load unless --cost-model off); 1 decodes one at a time; "
            "auto: 16 for Llama-style targets (llama, mistral, qwen2, qwen3), else 1.",
        ),
    ] = "auto",
    request_timeout: Annotated[
        float, typer.Option(help="Seconds a request may take, waiting included; then it is cut short.")
    ] = 600.0,
    max_model_len: Annotated[
        int | None, typer.Option(help="Prompt + generated tokens allowed (default: the target's positions).")
    ] = None,
    confidence_threshold: ConfidenceThresholdOption = None,
    cost_model: Annotated[
        str | None,
        typer.Option(
            help="Draft length per step. With --batch (the default for Llama-style targets) the load-aware rule "
            "(measured at start-up) unless 'off' (a fixed --num-speculative-tokens). One at a time: 'auto' "
            "measures this machine's step cost, or a StepCost JSON file; unset: fixed (docs/serving.md)."
        ),
    ] = None,
    prompt_lookup: PromptLookupOption = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="Model id clients send (default: target dir name).")
    ] = None,
    shutdown_grace: Annotated[
        float, typer.Option(help="On SIGTERM/Ctrl-C, seconds in-flight requests get to finish.")
    ] = 10.0,
    dtype: DTypeOption = DType.auto,
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
                batch=None if batch == "auto" else parse_batch(batch),
                request_timeout=request_timeout,
                max_model_len=max_model_len,
                model_name=served_model_name,
                shutdown_grace=shutdown_grace,
                dtype=torch_dtype(dtype),
            ),
            log=lambda m: typer.echo(m, err=True),
        )
    except DSparkError as exc:
        fail(str(exc))


def parse_batch(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise DSparkError(f"--batch expects a number of requests or auto, got {text!r}") from None
    if value < 1:
        raise DSparkError(f"--batch must be >= 1, got {value}")
    return value


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
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(info))
    else:
        typer.echo(json.dumps(info["speculative_config"]))
        typer.echo(info["command"])
