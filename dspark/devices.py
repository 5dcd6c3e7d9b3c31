"""Device names as users give them (``cpu``, ``cuda``, ``cuda:N``, ``auto``) to what torch takes,
with a clear error where the machine has no such device."""

from __future__ import annotations

import os
import warnings

from dspark.errors import DSparkError


class EmulatedBFloat16Warning(UserWarning):
    """bfloat16 asked for on a device that emulates it (a CPU without AVX512-BF16 or AMX)."""


def device_name(name: str, *, rank: int | None = None) -> str:
    """``auto`` is ``cuda`` where CUDA is available, else ``cpu``. ``rank`` (a DDP process):
    a bare ``cuda`` becomes the GPU of its local rank."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DSparkError(f"device {name}: no CUDA device is available")
        if name == "cuda" and rank is not None:
            return f"cuda:{int(os.environ.get('LOCAL_RANK', rank)) % torch.cuda.device_count()}"
    return name


def native_bfloat16(device: str) -> bool:
    """Whether ``device`` computes bfloat16 natively: a CUDA GPU that supports it, or a CPU with
    AVX512-BF16 or AMX (oneDNN's bf16 kernels); elsewhere bf16 is emulated and slower than float32."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def warn_if_emulated_bfloat16(what: str, device: str = "cpu") -> None:
    """Warn that ``what`` computes in bfloat16 on ``device`` where it is emulated: measured on an
    AVX2-only CPU (AMD EPYC, one thread), SmolLM2-135M's forward ran 9.5x and a 256x576x8192
    product 8.3x slower in bf16 than in float32. ``auto`` picks float32 there."""
    if not native_bfloat16(device):
        kind = "GPU" if device.startswith("cuda") else "CPU (no AVX512-BF16 or AMX)"
        warnings.warn(
            f"{what}: bfloat16 is emulated on this {kind}, several times slower than float32 "
            "(8-14x measured on an AVX2 CPU); 'auto' picks float32 here",
            EmulatedBFloat16Warning,
            stacklevel=2,
        )


def dtype_name(name: str, device: str = "cpu", *, what: str = "--dtype") -> str:
    """`compute_dtype` as a name: float32, bfloat16 or float16."""
    return str(compute_dtype(name, device, what=what)).removeprefix("torch.")


def compute_dtype(name: str, device: str = "cpu", *, what: str | None = None):
    """A dtype name as users give it to what torch takes. ``auto`` is vLLM's choice for a float32
    checkpoint: bfloat16 where ``device`` computes it natively, else float32. ``what``: the
    setting the name came from; an explicit bfloat16 where ``device`` emulates it then warns."""
    import torch

    if name == "auto":
        return torch.bfloat16 if native_bfloat16(device) else torch.float32
    if name == "bfloat16" and what:
        warn_if_emulated_bfloat16(what, device)
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    except KeyError:
        raise DSparkError(f"dtype {name!r}: expected auto, float32, bfloat16 or float16") from None
