"""`dspark train --config FILE.yaml`: the run description, strictly parsed (unknown keys are errors).

```yaml
preset: kimi-k2.7-code      # optional: drafter architecture + train defaults
target: /path/to/hf-target
data: /path/to/train.jsonl   # rows {"input_ids", "loss_mask"} from `dspark datagen`
out: runs/my-drafter
device: cpu                  # cpu | cuda | cuda:N | auto: where the drafter (and an in-process target) runs
source: online               # online (target in a worker process) | inprocess | offline (+ cache: DIR)
target_dtype: float32        # bfloat16 (~1.7x faster features on CPUs with AVX512-BF16, 8-14x slower on those without)
                             # or auto (bfloat16 where the device computes it natively): online, inprocess, ray
target_threads: 1            # torch threads of each of the online source's target processes (the trainer has its own)
target_workers: 1            # the online source's target processes (each computes every N-th row)
                             # | vllm (+ vllm: {url: URL}: a `dspark vllm-hidden-states` server) | ray
drafter:                     # init options (or `path:` to continue from a drafter directory)
  layers: 1
  block_size: 8
  markov_rank: 256
  vocab: vocab.safetensors   # from `dspark vocab` (optional: full target vocab otherwise)
  # method: eagle3           # the family: dspark (default), dflash (no heads), eagle3 (one
  # speculative_steps: 7     #   layer drafting a chain, its training-time test this deep)
train:                       # TrainConfig fields
  steps: 1000
  lr: 3.0e-4
```
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dspark.errors import ConfigError
from dspark.training.trainer import TrainConfig

TOP_KEYS = {
    "preset",
    "target",
    "target_dtype",
    "target_threads",
    "target_workers",
    "data",
    "out",
    "device",
    "source",
    "cache",
    "ray",
    "vllm",
    "drafter",
    "train",
    "seed",
}
TARGET_DTYPES = ("auto", "float32", "bfloat16")
RAY_KEYS = {"address", "num_workers", "num_cpus_per_worker", "in_flight"}
VLLM_KEYS = {"url", "concurrency"}
DRAFTER_KEYS = {"path", "method", "vocab"}  # and the init options of the families (`drafter_keys`)
SOURCES = ("online", "inprocess", "offline", "ray", "vllm")


@dataclass
class Recipe:
    target: Path
    data: Path
    out: Path
    source: str = "online"
    target_dtype: str = "float32"  # what the target computes features in (online, inprocess, ray)
    target_threads: int = 1  # torch threads of each of the online source's target processes
    target_workers: int = 1  # the online source's target processes
    device: str = "cpu"  # cpu, cuda, cuda:N or auto
    cache: Path | None = None  # feature cache directory for source: offline
    ray: dict = field(default_factory=dict)  # RaySource options for source: ray
    vllm: dict = field(default_factory=dict)  # VllmSource options for source: vllm (url, concurrency)
    preset: str | None = None
    drafter: dict = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)


PATH_KEYS = ("target", "data", "out", "cache")


def drafter_keys() -> set[str]:
    """Keys a recipe's ``drafter`` section may hold: a path, a family, a vocab, or the init
    options of any registered family (checked against the chosen family in `build_model`)."""
    from dspark import families

    keys = set(DRAFTER_KEYS)
    for name in families.names():
        keys |= families.get(name).init_options
    return keys - {"draft_vocab_size"}  # set from drafter.vocab


def apply_overrides(raw: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """``KEY=VALUE`` / ``SECTION.KEY=VALUE`` settings over a parsed recipe (VALUE read as YAML).
    Paths given this way are relative to the working directory, not to the recipe."""
    out = dict(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts) or len(parts) > 2:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE or SECTION.KEY=VALUE (e.g. train.steps=500)")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: value is not valid YAML ({exc})") from None
        if len(parts) == 1:
            out[parts[0]] = str(Path(value).resolve()) if parts[0] in PATH_KEYS and value is not None else value
            continue
        section = dict(out.get(parts[0]) or {})
        if parts[0] == "drafter" and parts[1] in ("vocab", "path") and isinstance(value, str):
            value = str(Path(value).resolve())
        section[parts[1]] = value
        out[parts[0]] = section
    return out


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    from dspark.training.presets import preset as get_preset

    src = Path(path)
    if not src.is_file():
        raise ConfigError(f"{src}: config file not found")
    try:
        raw = yaml.safe_load(src.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{src}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{src}: expected a mapping at the top level")
    raw = apply_overrides(raw, overrides)
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ConfigError(f"{src}: unknown key(s) {unknown}; allowed: {sorted(TOP_KEYS)}")
    for key in ("target", "data", "out"):
        if key not in raw:
            raise ConfigError(f"{src}: missing required key {key!r}")
    source = raw.get("source", "online")
    if source not in SOURCES:
        raise ConfigError(f"{src}: source must be one of {SOURCES}, got {source!r}")
    target_dtype = raw.get("target_dtype", "float32")
    if target_dtype not in TARGET_DTYPES:
        raise ConfigError(f"{src}: target_dtype must be one of {TARGET_DTYPES}, got {target_dtype!r}")
    if target_dtype not in ("float32", "auto") and source in ("offline", "vllm"):
        raise ConfigError(
            f"{src}: target_dtype applies to the sources that run the target here (online, inprocess, ray); "
            f"source: {source} computes its features elsewhere (a cache records its own dtype)"
        )
    target_threads = raw.get("target_threads", 1)
    if type(target_threads) is not int or target_threads < 1:
        raise ConfigError(f"{src}: target_threads must be an integer >= 1, got {target_threads!r}")
    if target_threads != 1 and source != "online":
        raise ConfigError(f"{src}: target_threads applies to source: online (its target process), not {source}")
    target_workers = raw.get("target_workers", 1)
    if type(target_workers) is not int or target_workers < 1:
        raise ConfigError(f"{src}: target_workers must be an integer >= 1, got {target_workers!r}")
    if target_workers != 1 and source != "online":
        raise ConfigError(f"{src}: target_workers applies to source: online (its target processes), not {source}")
    device = str(raw.get("device", "cpu"))
    if device not in ("cpu", "cuda", "auto") and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ConfigError(f"{src}: device must be cpu, cuda, cuda:N or auto, got {device!r}")
    target_dtype = _target_dtype(target_dtype, source, device)
    drafter = raw.get("drafter") or {}
    allowed = drafter_keys()
    bad = sorted(set(drafter) - allowed)
    if bad:
        raise ConfigError(f"{src}: unknown drafter key(s) {bad}; allowed: {sorted(allowed)}")
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    train_raw = dict(get_preset(raw["preset"])["train"]) if raw.get("preset") else {}
    user_train = raw.get("train") or {}
    bad = sorted(set(user_train) - train_fields)
    if bad:
        raise ConfigError(f"{src}: unknown train key(s) {bad}")
    train_raw.update(user_train)
    if "seed" in raw:
        train_raw["seed"] = raw["seed"]
    train_raw["autocast_bf16"] = _autocast(train_raw.get("autocast_bf16", False), device, src)
    try:
        train = TrainConfig(**train_raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{src}: train: {exc}") from None
    base = src.parent
    for key in ("vocab", "path"):  # file paths inside drafter: are relative to the recipe too
        if key in drafter and not Path(drafter[key]).is_absolute():
            drafter[key] = str((base / drafter[key]).resolve())
    if source == "offline" and "cache" not in raw:
        raise ConfigError(f"{src}: source: offline needs cache: DIR (built with `dspark cache-features`)")
    ray_opts = raw.get("ray") or {}
    bad = sorted(set(ray_opts) - RAY_KEYS)
    if bad:
        raise ConfigError(f"{src}: unknown ray key(s) {bad}; allowed: {sorted(RAY_KEYS)}")
    vllm_opts = raw.get("vllm") or {}
    bad = sorted(set(vllm_opts) - VLLM_KEYS)
    if bad:
        raise ConfigError(f"{src}: unknown vllm key(s) {bad}; allowed: {sorted(VLLM_KEYS)}")
    if source == "vllm" and "url" not in vllm_opts:
        raise ConfigError(f"{src}: source: vllm needs vllm: {{url: URL}} (a `dspark vllm-hidden-states` server)")
    return Recipe(
        ray=ray_opts,
        vllm=vllm_opts,
        cache=(base / raw["cache"]).resolve() if "cache" in raw else None,
        target=(base / raw["target"]).resolve() if not Path(raw["target"]).is_absolute() else Path(raw["target"]),
        data=(base / raw["data"]).resolve() if not Path(raw["data"]).is_absolute() else Path(raw["data"]),
        out=(base / raw["out"]).resolve() if not Path(raw["out"]).is_absolute() else Path(raw["out"]),
        source=source,
        target_dtype=target_dtype,
        target_threads=target_threads,
        target_workers=target_workers,
        device=device,
        preset=raw.get("preset"),
        drafter=drafter,
        train=train,
    )


def _drafter_device(device: str) -> str:
    """The recipe's device as it will run (``auto``: cuda where there is one); a device the
    machine lacks is left for the run to name."""
    from dspark.devices import device_name

    return device_name(device) if device == "auto" else device


def _target_dtype(name: str, source: str, device: str) -> str:
    """``target_dtype`` resolved where the target runs: the online and ray sources' workers on
    the CPU (for ray, this machine's CPU stands for the workers', which may be elsewhere: give
    an explicit dtype when they differ), the in-process one on the recipe's device; the offline
    and vllm sources run no target here (their features carry their own dtype), so ``auto`` is
    float32 there."""
    from dspark.devices import dtype_name

    if source in ("offline", "vllm"):
        return "float32"
    where = _drafter_device(device) if source == "inprocess" else "cpu"
    return dtype_name(name, where, what="target_dtype")


def _autocast(value, device: str, src: Path) -> bool:
    """``train.autocast_bf16``: true, false or auto (on where the drafter's device computes bf16
    natively); true on a device that emulates bf16 warns."""
    from dspark.devices import native_bfloat16, warn_if_emulated_bfloat16

    where = _drafter_device(device)
    if value == "auto":
        return native_bfloat16(where)
    if type(value) is not bool:
        raise ConfigError(f"{src}: train.autocast_bf16 must be true, false or auto, got {value!r}")
    if value:
        warn_if_emulated_bfloat16("train.autocast_bf16", where)
    return value


def build_model(recipe: Recipe, target):
    """The drafter a recipe starts from: an existing directory, a preset, or init options of
    its family (``drafter.method``, default dspark)."""
    import torch
    from safetensors.torch import load_file

    from dspark import families
    from dspark.formats.checkpoint import init_drafter, load_drafter
    from dspark.model.config import DSparkConfig
    from dspark.model.pairing import check_fits
    from dspark.training.presets import preset as get_preset

    opts = dict(recipe.drafter)
    method = opts.pop("method", "dspark")
    if method not in families.names():
        raise ConfigError(f"drafter.method must be one of {', '.join(families.names())}, got {method!r}")
    family = families.get(method)
    if "path" in opts:
        # Continue from a trained drafter: its architecture comes from its own config, so
        # init options beside `path` would be silently ignored; refuse them instead.
        if extra := sorted(set(opts) - {"path"}):
            raise ConfigError(f"drafter.path continues from a saved drafter; drop the init options {extra}")
        model = load_drafter(
            opts["path"],
            dtype=torch.float32,
            target_embedding=target.embedding_weight().detach().float().cpu(),
            target_lm_head=target.lm_head_weight().detach().float().cpu(),
            num_target_layers=target.num_layers,
        )
        if families.family_of(model.config).model_class is not family.model_class and recipe.drafter.get("method"):
            raise ConfigError(f"drafter.method is {method} but {opts['path']} holds a {model.config.method} drafter")
        check_fits(model.config, target)
        return model
    vocab = None
    if "vocab" in opts:
        vocab_path = Path(opts.pop("vocab"))
        if not vocab_path.is_file():
            raise ConfigError(f"drafter.vocab: {vocab_path} not found (build it with `dspark vocab`)")
        tables = load_file(str(vocab_path))
        if "d2t" not in tables or "t2d" not in tables:
            raise ConfigError(f"drafter.vocab: {vocab_path} holds no d2t/t2d tensors")
        vocab = (tables["d2t"], tables["t2d"])
    if recipe.preset:
        config = DSparkConfig(**get_preset(recipe.preset)["drafter"])
    else:
        if unknown := sorted(set(opts) - family.init_options):
            reads = sorted(family.init_options - {"draft_vocab_size"})
            raise ConfigError(f"drafter: {unknown} are not options of the {method} family (it reads {reads})")
        if vocab is not None:
            opts["draft_vocab_size"] = int(vocab[0].numel())
        config = family.config_for_target(target, opts)
    return init_drafter(target, config, seed=recipe.train.seed, vocab=vocab)
