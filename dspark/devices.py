"""Device names as users give them (``cpu``, ``cuda``, ``cuda:N``, ``auto``) to what torch takes,
with a clear error where the machine has no such device."""

from __future__ import annotations

import os

from dspark.errors import DSparkError


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
