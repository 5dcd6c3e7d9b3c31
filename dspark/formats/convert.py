"""One entry point per direction, shared by the CLI: open any drafter file or directory
(speculators / ours, GGUF, DFlash, DeepSpec) validated, export to speculators or GGUF, and
describe what was read (`describe_path`, behind ``dspark inspect``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dspark.defaults import public_target_name
from dspark.errors import CheckpointError, DSparkError
from dspark.formats.checkpoint import check_config_fits
from dspark.model.dspark import DSparkDraftModel
from dspark.model.pairing import check_fits
from dspark.target.frozen import TargetFacts, read_target_facts

FORMATS = ("speculators", "gguf")


def detect_kind(path: Path) -> str:
    if path.is_file() and path.suffix == ".gguf":
        return "gguf"
    if path.is_dir():
        return "speculators"
    raise CheckpointError(f"{path}: not found (expected a drafter directory or a .gguf file)")


def open_drafter(
    path: str | Path,
    *,
    kind: str | None = None,
    target=None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
):
    """Read and validate a drafter of any family and file kind: the one way in for every command.

    ``kind``: speculators (a directory: ours, speculators'), gguf, dflash (z-lab), deepspec;
    default from the path. ``target``: a loaded `TargetModel` (the drafter then goes to its
    device and dtype unless given), the `TargetFacts` of a target directory, or None to
    validate alone (frozen tensors the file leaves out are checked with zero placeholders of
    the right shape). With a target, the pair is checked from the config before any weights
    are read, and again once loaded (`check_fits`, one wording)."""
    from dspark.formats.checkpoint import load_config, load_drafter
    from dspark.formats.gguf import read_gguf
    from dspark.formats.importers import import_drafter

    src = Path(path)
    kind = kind or detect_kind(src)
    n_layers = target.num_layers if target is not None else None
    embed = target.embedding_weight() if target is not None else None
    head = target.lm_head_weight() if target is not None else None
    if kind in ("speculators", "ours"):
        if target is not None:
            check_config_fits(src, target)  # before the weights are read
        else:  # placeholders from the config's own shapes
            try:
                cfg = load_config(src)
            except DSparkError:
                cfg = None
            if cfg is not None:
                embed = head = torch.zeros(cfg.target_vocab_size, cfg.hidden_size)
    if kind == "gguf":
        model = read_gguf(src, num_target_layers=n_layers, target_embedding=embed, target_lm_head=head)
    elif kind in ("speculators", "ours"):
        model = load_drafter(src, target_embedding=embed, target_lm_head=head, num_target_layers=n_layers)
    else:
        if target is None:
            raise CheckpointError(f"--from {kind}: pass the target (--target DIR) for its embedding and lm_head")
        model = import_drafter(src, kind, num_target_layers=n_layers, target_embedding=embed, target_lm_head=head)
    if target is not None:
        check_fits(model.config, target)
    device = device if device is not None else getattr(target, "device", None)
    dtype = dtype if dtype is not None else getattr(target, "dtype", None)
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    return model


def fill_from_target(model: DSparkDraftModel, facts: TargetFacts | None) -> None:
    """Put the target's real embedding in place (placeholders must not leak) and record the target."""
    if facts is None:
        return
    with torch.no_grad():
        model.embed_tokens.weight.copy_(facts.embedding.to(model.embed_tokens.weight.dtype))
    # The verifier recorded in the export is the target it was checked against, by its public
    # name (a hub id or folder name, never this machine's path).
    extra = {**model.config.extra, "target": public_target_name(facts.directory)}
    if facts.architecture:
        extra["target_architecture"] = facts.architecture
    model.config = model.config.replace(extra=extra)


def refuse_overwrite(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise DSparkError(f"{out} exists; pass --force to replace it (nothing was written)")


def export_speculators(model: DSparkDraftModel, out: Path, *, dtype: torch.dtype | None, force: bool) -> Path:
    from dspark.formats.checkpoint import save_drafter

    refuse_overwrite(out, force)
    tmp = out.with_name(f".{out.name}.partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    save_drafter(model, tmp, dtype=dtype, include_embeddings=False)
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    tmp.rename(out)
    return out


def describe_path(path: str | Path, *, kind: str | None = None, target: str | Path | None = None) -> dict[str, Any]:
    """Validate a drafter of any kind and describe it (config, tensors, stored types)."""
    from dspark.formats.inspect import describe_config

    src = Path(path)
    kind = kind or detect_kind(src)
    facts = read_target_facts(target) if target is not None else None
    model = open_drafter(src, kind=kind, target=facts)
    info = describe_config(model.config)
    info.update(path=str(src), format=kind, valid=True)
    if facts is not None:
        info["target"] = str(facts.directory)
    stored: dict[str, dict[str, Any]] = {}
    if kind == "gguf":
        import gguf

        reader = gguf.GGUFReader(str(src))
        for t in reader.tensors:
            stored[t.name] = {"shape": [int(s) for s in reversed(t.shape.tolist())], "dtype": t.tensor_type.name}
        info["bytes"] = src.stat().st_size
    else:
        from safetensors import safe_open

        total = 0
        for file in sorted(src.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                    sl = fh.get_slice(name)
                    stored[name] = {"shape": list(sl.get_shape()), "dtype": sl.get_dtype()}
            total += file.stat().st_size
        info["bytes"] = total
    info.update(tensor_shapes=stored, tensors=len(stored), float_dtype="as stored")
    return info


SPECULATORS_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def export_drafter(
    draft: str | Path,
    fmt: str,
    out: Path,
    *,
    target_dir: Path | None = None,
    outtype: str | None = None,
    tokenizer_from: Path | None = None,
    force: bool = False,
    log: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """`dspark export`: open ``draft`` (checked against ``target_dir`` when given; GGUF needs
    it for the tokenizer and frozen tensors) and write it as a speculators checkpoint or a
    llama.cpp GGUF at ``out`` (``outtype`` default: bf16 / f16). Returns the report (path, format, outtype; GGUF: bytes,
    tensors, what was dropped and notes)."""
    if fmt not in FORMATS:
        raise DSparkError(f"--format {fmt!r}: choose {' or '.join(FORMATS)}")
    facts = read_target_facts(target_dir) if target_dir is not None else None
    model = open_drafter(draft, target=facts)
    fill_from_target(model, facts)
    if fmt == "speculators":
        outtype = outtype or "bf16"
        if outtype not in SPECULATORS_DTYPES:
            raise DSparkError(f"--outtype {outtype!r}: a speculators checkpoint is f32, bf16 or f16")
        path = export_speculators(model, out, dtype=SPECULATORS_DTYPES[outtype], force=force)
        return {"path": str(path), "format": "speculators", "outtype": outtype, "notes": vllm_notes(path)}
    from dspark.formats.gguf import export_gguf, resolve_tokenizer

    refuse_overwrite(out, force)
    if tokenizer_from is None and target_dir is None:
        raise DSparkError("a GGUF export needs the target (--target DIR) or --tokenizer-from TARGET.gguf")
    result = export_gguf(
        model,
        out,
        outtype=outtype or "f16",
        tokenizer=resolve_tokenizer(tokenizer_from or target_dir),
        name=Path(draft).name,
        log=log,
    )
    return {
        "path": str(result.path),
        "format": "gguf",
        "outtype": result.outtype,
        "bytes": result.bytes,
        "tensors": result.tensors,
        "dropped": result.dropped,
        "notes": result.notes,
    }


def vllm_notes(export: Path) -> list[str]:
    """Whether vLLM would serve a speculators export as trained: an empty list, or why not (its
    family's reading of the fields, `DrafterFamily.vllm_checks`), so `dspark export` says so."""
    from dspark import families
    from dspark.formats.speculators import CONFIG_NAME, read_json

    data = read_json(Path(export) / CONFIG_NAME)
    method = data.get("speculators_model_type")
    family = families.get(method)
    if family.vllm_checks is None:
        return [f"vLLM has no method for {method} drafters; serve it with `dspark serve`"]
    try:
        family.vllm_checks(data, export, 1)  # one draft a step: every family's smallest valid k
    except DSparkError as exc:
        return [f"vLLM cannot serve this export as trained: {exc}"]
    return []
