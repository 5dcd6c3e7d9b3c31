"""`dspark check`: peer tools read our drafters as we mean them (dspark.interop)."""

from __future__ import annotations

import typer

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
