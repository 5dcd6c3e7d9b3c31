"""The one `app` every stage module adds its commands to, and what they share."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from dspark.devices import device_name  # noqa: F401 - the commands import it from here
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
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


def torch_dtype(name: DType, device: str = "cpu", *, flag: str = "--dtype"):
    """``auto``: bfloat16 where ``device`` computes it natively (AVX512-BF16/AMX CPUs, bf16 GPUs),
    else float32 -- what vLLM serves a float32 checkpoint in (docs/serving.md). An explicit
    bfloat16 where ``device`` emulates it warns, naming ``flag``."""
    from dspark.devices import compute_dtype

    return compute_dtype(name.value, device, what=flag)


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def parse_ids(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        fail(f"{flag} expects comma-separated integers, got {text!r}")
    return None


# Options many commands share, declared once.
DTypeOption = Annotated[
    DType,
    typer.Option(
        help="Compute dtype of target and drafters. auto: bfloat16 where the device computes it natively "
        "(CPUs with AVX512-BF16 or AMX, bf16 GPUs; ~2x float32's batched throughput on CPU), else float32, "
        "as vLLM serves a float32 checkpoint. Greedy text follows the dtype (docs/serving.md)."
    ),
]
TargetOption = Annotated[Path | None, typer.Option(help="Target model directory (default: the embedded one).")]
ConfidenceThresholdOption = Annotated[
    float | None, typer.Option(help="Stop a draft once the predicted survival prod(c_i) falls below this.")
]
CostModelOption = Annotated[
    str | None,
    typer.Option(
        help="Draft length per step from a cost model: 'auto' measures this machine's target and "
        "draft times first (seconds), or a StepCost JSON file (docs/benchmarking.md); 'off' (the default "
        "here): the fixed --num-speculative-tokens."
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


def encode_text(target, prompt: str, chat: bool):
    from dspark.target.prompts import encode_prompt

    if target.tokenizer is None:
        raise DSparkError(f"{target.name}: no tokenizer found, cannot encode --prompt")
    ids = encode_prompt(target.tokenizer, prompt, chat=chat)
    if not ids:
        raise DSparkError("the prompt encodes to zero tokens")
    return ids
