"""What a drafter is made of: tensor count, parameters and bytes, without allocating weights."""

from __future__ import annotations

from pathlib import Path

import torch

from dspark.families import family_of


def describe_config(config, *, float_dtype: torch.dtype = torch.bfloat16) -> dict:
    """Shapes of the checkpoint a config implies (instantiated on the meta device)."""
    with torch.device("meta"):
        model = family_of(config).model_class(config)
    tensors = {}
    total_bytes = 0
    for name, t in model.state_dict().items():
        dtype = float_dtype if t.is_floating_point() else t.dtype
        nbytes = t.numel() * torch.empty(0, dtype=dtype).element_size()
        total_bytes += nbytes
        tensors[name] = {"shape": list(t.shape), "dtype": str(dtype).removeprefix("torch.")}
    params = sum(t.numel() for t in model.state_dict().values() if t.is_floating_point())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "method": config.method,
        "tensors": len(tensors),
        "parameters": params,
        "trainable_parameters": trainable,
        "bytes": total_bytes,
        "float_dtype": str(float_dtype).removeprefix("torch."),
        "config": config.to_dict(),
        "tensor_shapes": tensors,
    }


def describe_checkpoint(path: str | Path) -> dict:
    """Read and validate a checkpoint; report it in its stored dtypes."""
    from safetensors import safe_open

    from dspark.formats.checkpoint import WEIGHTS_NAME, load_config, load_drafter

    config = load_config(path)
    # Validates config, names, shapes and the vocab mapping; a checkpoint that takes its
    # embedding from the target is checked with a placeholder of the right shape.
    model = load_drafter(path, target_embedding=torch.zeros(config.target_vocab_size, config.hidden_size))
    info = describe_config(model.config)
    stored, total = {}, 0
    with safe_open(str(Path(path) / WEIGHTS_NAME), framework="pt") as fh:
        for name in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
            t = fh.get_slice(name)
            shape = t.get_shape()
            dtype = t.get_dtype()
            numel = 1
            for s in shape:
                numel *= s
            size = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "BOOL": 1}.get(dtype, 4)
            total += numel * size
            stored[name] = {"shape": list(shape), "dtype": dtype}
    info.update(bytes=total, tensor_shapes=stored, float_dtype="as stored", path=str(path))
    return info
