"""GGUF export and import for llama.cpp's ``draft-dspark`` (DESIGN §4).

The authority is the llama.cpp vendored in ``llama-cpp-python==0.3.36``
(``gguf-py/gguf/constants.py``, ``conversion/qwen.py`` ``DSparkModel``,
``src/models/dflash.cpp``, ``common/speculative.cpp``). A DSpark draft there is
``general.architecture = "dflash"`` with the Qwen3 backbone tensors, ``fc`` and
``enc.output_norm`` (our ``hidden_norm``), ``markov_w1``/``markov_w2``, an optional
``conf_proj`` (weight [H + r, 1] and bias), and ``d2t`` holding *absolute* target ids
(offsets in safetensors). Metadata: ``dflash.block_size``, ``dflash.target_layers`` (ids of
target layers whose *input* is captured: the speculators convention, HF
``hidden_states[i]``), ``dflash.sample_from_anchor``, ``dflash.has_confidence_head`` and
``tokenizer.ggml.mask_token_id`` in the draft's own copy of the target tokenizer.

What a GGUF cannot carry: ``gated`` / ``rnn`` Markov heads (llama.cpp runs ``vanilla``
only; export refuses), a confidence head without the Markov input
(``confidence_head_with_markov=false``; export drops it and says so), and ``t2d`` (rebuilt
from ``d2t``). llama.cpp's Markov chain is greedy. We also store our full config as the
string ``dspark.config`` so a round trip is exact; llama.cpp ignores that key.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dspark.errors import CheckpointError, ConfigError, DSparkError
from dspark.model.config import DSparkConfig
from dspark.model.dspark import DSparkDraftModel

ARCH = "dflash"
CONFIG_KEY = "dspark.config"

# Our name -> GGUF name; None = not carried, on purpose. "{i}" stands for the layer index.
TENSOR_NAME_MAP: dict[str, str | None] = {
    "embed_tokens.weight": "token_embd.weight",
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "layers.{i}.self_attn.q_norm.weight": "blk.{i}.attn_q_norm.weight",
    "layers.{i}.self_attn.k_norm.weight": "blk.{i}.attn_k_norm.weight",
    "layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "markov_head.markov_w1.weight": "markov_w1.weight",
    "markov_head.markov_w2.weight": "markov_w2.weight",
    "confidence_head.proj.weight": "conf_proj.weight",
    "confidence_head.proj.bias": "conf_proj.bias",
    "d2t": "d2t",  # absolute target ids in GGUF (offsets in safetensors)
    "t2d": None,  # unused by llama.cpp; rebuilt from d2t on import
    "markov_head.gate_proj.weight": None,  # gated / rnn heads: llama.cpp runs vanilla only
    "markov_head.gate_proj.bias": None,
    "markov_head.joint_proj.weight": None,
    "markov_head.joint_proj.bias": None,
}

# Output types the `gguf` package can write. K-quants (q4_k, q6_k, ...) have no Python
# quantiser there; make them from an f16 file with llama.cpp's own ``llama-quantize``.
OUTTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
# llama_ftype numbers for general.file_type.
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "bf16": 32}
# Small or precision-critical tensors stay f32 whatever the outtype (as llama.cpp's converter does for norms).
_KEEP_F32 = ("fc.weight", "conf_proj.weight", "conf_proj.bias")


def _gguf():
    try:
        import gguf
    except ImportError:  # pragma: no cover - depends on the environment
        raise DSparkError("GGUF support needs the 'gguf' package: pip install 'dspark[gguf]'") from None
    return gguf


def gguf_name(name: str) -> str | None:
    """The GGUF name of one of our tensors (None = not carried). KeyError if unknown."""
    parts = name.split(".")
    if parts[0] == "layers":
        key = ".".join(["layers", "{i}", *parts[2:]])
        target = TENSOR_NAME_MAP[key]
        return None if target is None else target.replace("{i}", parts[1])
    return TENSOR_NAME_MAP[name]


def _reverse_map(num_layers: int) -> dict[str, str]:
    out = {}
    for ours, theirs in TENSOR_NAME_MAP.items():
        if theirs is None:
            continue
        if "{i}" in ours:
            for i in range(num_layers):
                out[theirs.replace("{i}", str(i))] = ours.replace("{i}", str(i))
        else:
            out[theirs] = ours
    return out


# ---------------------------------------------------------------------------- tokenizer
@dataclass
class TokenizerFields:
    """``tokenizer.*`` key/values to put in the draft GGUF: [(key, value, value_type)]."""

    items: list[tuple[str, Any, Any]] = field(default_factory=list)
    source: str = ""


def tokenizer_from_gguf(path: Path) -> TokenizerFields:
    """Copy every ``tokenizer.*`` field of a target GGUF (the exact vocab llama.cpp checks)."""
    gguf = _gguf()
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - the reader raises many types on a bad file
        raise CheckpointError(f"{path}: not a readable GGUF file ({exc})") from None
    out = TokenizerFields(source=str(path))
    for key, fld in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = fld.types[0]
        sub = fld.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        out.items.append((key, fld.contents(), (vtype, sub)))
    if not any(k == "tokenizer.ggml.tokens" for k, _, _ in out.items):
        raise CheckpointError(f"{path}: GGUF has no tokenizer (tokenizer.ggml.tokens)")
    return out


def tokenizer_from_hf(directory: Path) -> TokenizerFields:
    """Build GGUF tokenizer fields from a Hugging Face ``tokenizer.json`` (byte-level BPE)."""
    gguf = _gguf()
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no tokenizer.json; pass a target GGUF to copy the tokenizer from")
    data = json.loads(path.read_text())
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise CheckpointError(
            f"{path}: tokenizer model {model.get('type')!r} is not supported here (byte-level BPE only); "
            "pass the target as a GGUF file (--tokenizer-from FILE.gguf) to copy its tokenizer"
        )
    vocab: dict[str, int] = dict(model["vocab"])
    special = set()
    for tok in data.get("added_tokens", []):
        vocab[tok["content"]] = tok["id"]
        if tok.get("special"):
            special.add(tok["id"])
    size = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, idx in vocab.items():
        tokens[idx] = text
        types[idx] = gguf.TokenType.CONTROL if idx in special else gguf.TokenType.NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    cfg_path = directory / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}

    def token_id(value) -> int | None:
        if isinstance(value, dict):
            value = value.get("content")
        return vocab.get(value) if isinstance(value, str) else None

    S, A = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY
    U32, B, I32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.BOOL, gguf.GGUFValueType.INT32
    out = TokenizerFields(source=str(path))
    out.items += [
        ("tokenizer.ggml.model", "gpt2", (S, None)),
        ("tokenizer.ggml.pre", "default", (S, None)),
        ("tokenizer.ggml.tokens", tokens, (A, S)),
        ("tokenizer.ggml.token_type", [int(t) for t in types], (A, I32)),
        ("tokenizer.ggml.merges", merges, (A, S)),
    ]
    for key, name in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"), ("padding", "pad_token")):
        idx = token_id(tcfg.get(name))
        if idx is not None:
            out.items.append((f"tokenizer.ggml.{key}_token_id", idx, (U32, None)))
    out.items.append(("tokenizer.ggml.add_bos_token", bool(tcfg.get("add_bos_token", False)), (B, None)))
    out.items.append(("tokenizer.ggml.add_eos_token", bool(tcfg.get("add_eos_token", False)), (B, None)))
    return out


def resolve_tokenizer(source: str | Path) -> TokenizerFields:
    src = Path(source)
    if src.is_file() and src.suffix == ".gguf":
        return tokenizer_from_gguf(src)
    if src.is_dir():
        ggufs = sorted(src.glob("*.gguf"))
        return tokenizer_from_gguf(ggufs[0]) if ggufs else tokenizer_from_hf(src)
    raise CheckpointError(f"{src}: no tokenizer source (expected a target directory or a .gguf file)")


# ---------------------------------------------------------------------------- export
@dataclass
class ExportReport:
    path: Path
    outtype: str
    bytes: int
    tensors: dict[str, str]  # GGUF name -> stored type
    dropped: list[str]  # our tensors not carried, with the reason
    notes: list[str]


def _quant_type(gguf, outtype: str):
    return {
        "f32": gguf.GGMLQuantizationType.F32,
        "f16": gguf.GGMLQuantizationType.F16,
        "bf16": gguf.GGMLQuantizationType.BF16,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
        "q4_0": gguf.GGMLQuantizationType.Q4_0,
        "q4_1": gguf.GGMLQuantizationType.Q4_1,
        "q5_0": gguf.GGMLQuantizationType.Q5_0,
        "q5_1": gguf.GGMLQuantizationType.Q5_1,
    }[outtype]


def _encode(gguf, name: str, array: np.ndarray, outtype: str) -> tuple[np.ndarray, Any]:
    """The array as stored and its GGML type (quantised 2-D weights; f32 1-D and small ones)."""
    f32 = gguf.GGMLQuantizationType.F32
    if array.ndim == 1 or name in _KEEP_F32 or outtype == "f32":
        return array.astype(np.float32), f32
    qtype = _quant_type(gguf, outtype)
    if outtype == "f16":
        return array.astype(np.float16), qtype
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if array.shape[-1] % block:
        # Rows that do not split into whole blocks stay f16 (llama.cpp's quantiser does the same).
        return array.astype(np.float16), gguf.GGMLQuantizationType.F16
    return gguf.quants.quantize(array.astype(np.float32), qtype), qtype


def export_gguf(
    model: DSparkDraftModel,
    out: str | Path,
    *,
    outtype: str = "f16",
    tokenizer: TokenizerFields,
    name: str = "dspark-draft",
    log: Callable[[str], None] = lambda _msg: None,
) -> ExportReport:
    """Write ``model`` as a llama.cpp ``draft-dspark`` GGUF at ``out`` (atomically)."""
    from dspark.families import family_of
    from dspark.formats.checkpoint import config_json_text
    from dspark.io import atomic_write

    refusal = family_of(model.config).gguf_refusal
    if refusal is not None:
        raise DSparkError(refusal)
    gguf = _gguf()
    if outtype not in OUTTYPES:
        raise DSparkError(f"--outtype {outtype!r}: choose from {', '.join(OUTTYPES)} (K-quants: see docs/formats.md)")
    cfg = model.config
    if cfg.markov_rank > 0 and cfg.markov_head_type != "vanilla":
        raise DSparkError(
            f"markov_head_type {cfg.markov_head_type!r} cannot be carried by a GGUF: llama.cpp's draft-dspark "
            "runs the vanilla Markov head only"
        )
    notes, dropped = [], []
    conf_ok = cfg.enable_confidence_head and cfg.confidence_head_with_markov
    if cfg.enable_confidence_head and not conf_ok:
        notes.append(
            "the confidence head reads the hidden state only (confidence_head_with_markov=false); llama.cpp's "
            "conf_proj expects [hidden ; W1[prev]], so it was left out"
        )
    if cfg.markov_rank > 0:
        notes.append("llama.cpp decodes the Markov chain greedily inside the block")
    tokens = next(v for k, v, _ in tokenizer.items if k == "tokenizer.ggml.tokens")
    if len(tokens) != cfg.target_vocab_size:
        raise DSparkError(
            f"tokenizer from {tokenizer.source} has {len(tokens)} tokens, the drafter's target vocab is "
            f"{cfg.target_vocab_size}: not the drafter's target"
        )

    def write(tmp: str) -> dict[str, str]:
        writer = gguf.GGUFWriter(tmp, ARCH)
        writer.add_name(name)
        writer.add_file_type(_FILE_TYPE[outtype])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_context_length(cfg.max_position_embeddings)
        writer.add_embedding_length(cfg.hidden_size)
        writer.add_feed_forward_length(cfg.intermediate_size)
        writer.add_block_count(cfg.num_hidden_layers)
        writer.add_head_count(cfg.num_attention_heads)
        writer.add_head_count_kv(cfg.num_key_value_heads)
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        writer.add_rope_freq_base(cfg.rope_theta)
        writer.add_uint32(f"{ARCH}.block_size", cfg.block_size)
        writer.add_array(f"{ARCH}.target_layers", [int(i) for i in cfg.aux_hidden_state_layer_ids])
        writer.add_bool(f"{ARCH}.sample_from_anchor", cfg.sample_from_anchor)
        writer.add_bool(f"{ARCH}.has_confidence_head", bool(conf_ok and model.confidence_head is not None))
        carried = cfg if conf_ok or not cfg.enable_confidence_head else cfg.replace(enable_confidence_head=False)
        writer.add_string(CONFIG_KEY, config_json_text(carried))
        for key, value, (vtype, sub) in tokenizer.items:
            if key == "tokenizer.ggml.mask_token_id":
                continue
            if vtype == gguf.GGUFValueType.ARRAY:
                writer.add_key_value(key, list(value), vtype, sub_type=sub)
            else:
                writer.add_key_value(key, value, vtype)
        writer.add_mask_token_id(cfg.mask_token_id)
        stored = {}
        state = model.state_dict()
        for ours, tensor in state.items():
            theirs = gguf_name(ours)
            if theirs is None:
                if ours != "t2d":
                    dropped.append(f"{ours} (not carried by GGUF)")
                continue
            if theirs.startswith("conf_proj") and not conf_ok:
                dropped.append(f"{ours} (confidence head without Markov input)")
                continue
            if ours == "d2t":
                ids = model.draft_to_target.cpu().numpy().astype(np.int64)
                if not cfg.uses_pruned_vocab:
                    continue  # full vocab: llama.cpp needs no table
                writer.add_tensor("d2t", ids, raw_dtype=gguf.GGMLQuantizationType.I64)
                stored["d2t"] = "I64"
                continue
            array = tensor.detach().float().cpu().numpy()
            data, qtype = _encode(gguf, theirs, array, outtype)
            writer.add_tensor(theirs, data, raw_dtype=qtype)
            stored[theirs] = qtype.name
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file(progress=False)
        writer.close()
        return stored

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log(f"writing {out} ({outtype}, tokenizer from {tokenizer.source}) ...")
    result: dict[str, dict[str, str]] = {}
    atomic_write(out, lambda tmp: result.setdefault("stored", write(tmp)))
    return ExportReport(out, outtype, out.stat().st_size, result["stored"], dropped, notes)


# ---------------------------------------------------------------------------- import
def _config_from_metadata(reader, shapes: dict[str, tuple[int, ...]], path: Path, num_target_layers: int | None):
    from dspark.formats.speculators import from_speculators_dict

    fields = reader.fields
    if CONFIG_KEY in fields:
        data = json.loads(fields[CONFIG_KEY].contents())
        return from_speculators_dict(data, source=f"{path} [{CONFIG_KEY}]", num_target_layers=num_target_layers)

    def get(key, default=None):
        return fields[key].contents() if key in fields else default

    arch = get("general.architecture")
    if arch != ARCH:
        raise CheckpointError(f"{path}: general.architecture is {arch!r}, expected {ARCH!r} (a DFlash/DSpark draft)")
    if num_target_layers is None:
        raise CheckpointError(f"{path}: written by another tool; pass the target so its layer count is known")
    hidden = int(get(f"{ARCH}.embedding_length"))
    heads = int(get(f"{ARCH}.attention.head_count"))
    rank = shapes["markov_w1.weight"][1] if "markov_w1.weight" in shapes else 0
    vocab = shapes["token_embd.weight"][0] if "token_embd.weight" in shapes else len(get("tokenizer.ggml.tokens", []))
    draft_vocab = shapes["d2t"][0] if "d2t" in shapes else vocab
    mask = get("tokenizer.ggml.mask_token_id")
    if mask is None:
        raise CheckpointError(f"{path}: no tokenizer.ggml.mask_token_id")
    return DSparkConfig(
        num_hidden_layers=int(get(f"{ARCH}.block_count")),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=int(get(f"{ARCH}.attention.head_count_kv", heads)),
        head_dim=int(get(f"{ARCH}.attention.key_length", hidden // heads)),
        intermediate_size=int(get(f"{ARCH}.feed_forward_length")),
        draft_vocab_size=int(draft_vocab),
        target_vocab_size=int(vocab),
        target_hidden_size=hidden,
        aux_hidden_state_layer_ids=tuple(int(i) for i in get(f"{ARCH}.target_layers")),
        num_target_layers=num_target_layers,
        block_size=int(get(f"{ARCH}.block_size", 16)),
        mask_token_id=int(mask),
        sample_from_anchor=bool(get(f"{ARCH}.sample_from_anchor", False)),
        markov_rank=int(rank),
        enable_confidence_head="conf_proj.weight" in shapes,
        confidence_head_with_markov="conf_proj.weight" in shapes,
        rope_theta=float(get(f"{ARCH}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(get(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(get(f"{ARCH}.context_length", 32768)),
    )


def read_gguf(
    path: str | Path,
    *,
    num_target_layers: int | None = None,
    target_embedding: torch.Tensor | None = None,
    target_lm_head: torch.Tensor | None = None,
) -> DSparkDraftModel:
    """Read a ``draft-dspark`` GGUF back into our drafter, dequantised to fp32."""
    from dspark.formats.checkpoint import build_drafter
    from dspark.model.vocab import mapping_from_kept_ids

    gguf = _gguf()
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: GGUF file not found")
    try:
        reader = gguf.GGUFReader(str(path))
        tensors = {t.name: t for t in reader.tensors}
    except Exception as exc:  # noqa: BLE001 - the reader raises many types on a damaged file
        raise CheckpointError(f"{path}: cannot read GGUF (truncated or corrupt?): {exc}") from None
    arch = reader.fields["general.architecture"].contents() if "general.architecture" in reader.fields else None
    if arch != ARCH:
        raise CheckpointError(f"{path}: general.architecture is {arch!r}, expected {ARCH!r} (a DFlash/DSpark draft)")
    shapes = {name: tuple(int(s) for s in reversed(t.shape.tolist())) for name, t in tensors.items()}
    try:
        config = _config_from_metadata(reader, shapes, path, num_target_layers)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    reverse = _reverse_map(config.num_hidden_layers)
    state: dict[str, torch.Tensor] = {}
    unknown = []
    for name, t in tensors.items():
        if name == "d2t":
            ids = torch.from_numpy(np.array(t.data, dtype=np.int64).reshape(-1))
            if ids.numel() and (ids.min() < 0 or ids.max() >= config.target_vocab_size):
                raise CheckpointError(f"{path}: d2t holds ids outside the target vocab [0, {config.target_vocab_size})")
            if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
                raise CheckpointError(f"{path}: d2t target ids are not strictly ascending")
            state["d2t"], state["t2d"] = mapping_from_kept_ids(ids, config.target_vocab_size)
            continue
        ours = reverse.get(name)
        if ours is None:
            unknown.append(name)
            continue
        array = gguf.quants.dequantize(t.data, t.tensor_type)
        state[ours] = torch.from_numpy(np.array(array, dtype=np.float32, copy=True)).reshape(shapes[name])
    if unknown:
        raise CheckpointError(f"{path}: tensors this drafter does not have: {unknown[:6]}")
    # ggml drops trailing unit dimensions (llama-quantize writes conf_proj [H + r, 1] as [H + r]).
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in DSparkDraftModel(config).state_dict().items()}
    for name, tensor in state.items():
        want = expected.get(name)
        if want is not None and tuple(tensor.shape) != want and tensor.numel() == int(np.prod(want)):
            state[name] = tensor.reshape(want)
    return build_drafter(
        config,
        state,
        source=str(path),
        target_embedding=target_embedding,
        target_lm_head=target_lm_head,
    )
