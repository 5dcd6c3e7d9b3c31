"""Formats: speculators (native), GGUF, DFlash / DeepSpec / speculators imports, and damage.

Round trips compare the teacher-forced block logits (backbone + Markov bias) and the
confidence logits of the drafter before and after. Tolerances: fp32 exact; GGUF f16 within
2e-2 and q8_0 within 0.25 absolute (seen: 0.10) on logits of scale ~3.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from dspark.cli import app
from dspark.errors import CheckpointError, DSparkError
from dspark.formats import gguf as gguf_format
from dspark.formats import speculators as spec_format
from dspark.formats.checkpoint import WEIGHTS_NAME, init_drafter, load_drafter, save_drafter
from dspark.formats.convert import export_speculators, open_drafter
from dspark.formats.gguf import export_gguf, read_gguf, resolve_tokenizer
from dspark.formats.importers import import_drafter
from dspark.model.pairing import config_for_target
from dspark.model.vocab import mapping_from_kept_ids
from dspark.target.frozen import read_target_facts
from dspark.training.forward import block_forward

runner = CliRunner()

VARIANTS = {
    "anchor-vanilla": {},
    "dflash-layout": {"sample_from_anchor": False},
    "gated": {"markov_head_type": "gated"},
    "rnn": {"markov_head_type": "rnn"},
    "conf-without-markov": {"confidence_head_with_markov": False},
    "dflash": {"markov_rank": 0, "enable_confidence_head": False, "sample_from_anchor": False},
}


def make_drafter(target, *, pruned: bool = True, **changes):
    torch.manual_seed(3)
    kwargs = {"draft_vocab_size": 150} if pruned else {}
    config = config_for_target(target, num_layers=2, block_size=6, markov_rank=16, **kwargs).replace(**changes)
    vocab = mapping_from_kept_ids(torch.arange(0, 300, 2), target.vocab_size) if pruned else None
    model = init_drafter(target, config, vocab=vocab)
    with torch.no_grad():  # heads start near zero; make them matter
        for name, p in model.named_parameters():
            if name.startswith(("markov_head", "confidence_head")):
                p.normal_(0, 0.3)
    return model.eval()


def outputs(model):
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    t = 32
    aux = torch.randn(t, len(cfg.aux_hidden_state_layer_ids) * cfg.target_hidden_size, generator=g)
    ids = torch.randint(0, cfg.target_vocab_size, (t,), generator=g)
    anchors = torch.tensor([2, 9, 17, t - cfg.block_size - 2])
    with torch.inference_mode():
        out = block_forward(
            model.float(), aux, ids, torch.ones(t, dtype=torch.bool), torch.zeros(t, dtype=torch.long), anchors
        )
    return out.logits, out.confidence_logits


def assert_same_outputs(a, b, atol=0.0):
    (la, ca), (lb, cb) = outputs(a), outputs(b)
    torch.testing.assert_close(lb, la, atol=atol, rtol=0)
    if ca is None:
        assert cb is None
    else:
        torch.testing.assert_close(cb, ca, atol=atol, rtol=0)


@pytest.fixture(scope="module")
def qwen3(tiny_targets):
    return tiny_targets["qwen3"]


@pytest.fixture(scope="module")
def facts(tiny_target_dirs):
    return read_target_facts(tiny_target_dirs["qwen3"])


# ---------------------------------------------------------------------------- speculators
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_speculators_round_trip_is_exact_in_fp32(qwen3, tmp_path, variant):
    model = make_drafter(qwen3, **VARIANTS[variant])
    export_speculators(model, tmp_path / "s", dtype=torch.float32, force=False)
    data = json.loads((tmp_path / "s" / "config.json").read_text())
    assert data["speculators_model_type"] == model.config.method
    assert data["sample_from_anchor"] is model.config.sample_from_anchor
    assert "embed_tokens.weight" not in load_file(str(tmp_path / "s" / WEIGHTS_NAME))  # as speculators saves
    back = load_drafter(tmp_path / "s", target_embedding=qwen3.embedding_weight())
    assert back.config == model.config
    assert_same_outputs(model, back)


def test_full_vocab_export_leaves_out_vocab_tables_and_takes_them_back(qwen3, tmp_path):
    model = make_drafter(qwen3, pruned=False)
    save_drafter(model, tmp_path / "f", include_embeddings=False)
    state = load_file(str(tmp_path / "f" / WEIGHTS_NAME))
    assert "d2t" not in state and "t2d" not in state
    back = load_drafter(tmp_path / "f", target_embedding=qwen3.embedding_weight())
    assert torch.equal(back.d2t, torch.zeros_like(back.d2t)) and bool(back.t2d.all())
    assert_same_outputs(model, back)


def test_every_tensor_of_every_variant_has_a_mapping_entry(qwen3):
    for changes in VARIANTS.values():
        for name in make_drafter(qwen3, **changes).state_dict():
            generic = ".".join(["layers", "{i}", *name.split(".")[2:]]) if name.startswith("layers.") else name
            key0 = name if not name.startswith("layers.") else ".".join(["layers", "0", *name.split(".")[2:]])
            assert key0 in spec_format.TENSOR_NAME_MAP, name
            assert generic in gguf_format.TENSOR_NAME_MAP, name


# ---------------------------------------------------------------------------- GGUF
@pytest.mark.parametrize(("outtype", "atol"), [("f32", 0.0), ("f16", 2e-2), ("q8_0", 0.25)])
def test_gguf_round_trip(qwen3, tiny_target_dirs, tmp_path, outtype, atol):
    model = make_drafter(qwen3)
    report = export_gguf(
        model, tmp_path / "d.gguf", outtype=outtype, tokenizer=resolve_tokenizer(tiny_target_dirs["qwen3"])
    )
    assert report.tensors["d2t"] == "I64"
    back = read_gguf(tmp_path / "d.gguf")
    assert back.config == model.config
    assert torch.equal(back.d2t, model.d2t) and torch.equal(back.t2d, model.t2d)
    assert_same_outputs(model, back, atol=atol)


def test_gguf_layout_follows_llama_cpp(qwen3, tiny_target_dirs, tmp_path):
    import gguf

    model = make_drafter(qwen3)
    export_gguf(model, tmp_path / "d.gguf", outtype="f16", tokenizer=resolve_tokenizer(tiny_target_dirs["qwen3"]))
    reader = gguf.GGUFReader(str(tmp_path / "d.gguf"))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    cfg = model.config
    assert fields["general.architecture"] == "dflash"
    assert fields["dflash.block_size"] == cfg.block_size
    assert fields["dflash.target_layers"] == list(cfg.aux_hidden_state_layer_ids)  # input of layer i
    assert fields["dflash.sample_from_anchor"] is True
    assert fields["dflash.has_confidence_head"] is True
    assert reader.fields["tokenizer.ggml.mask_token_id"].contents() == cfg.mask_token_id
    tensors = {t.name: t for t in reader.tensors}
    d2t = np.array(tensors["d2t"].data)
    assert d2t.tolist() == list(range(0, 300, 2))  # absolute target ids in GGUF
    rank, hidden = cfg.markov_rank, cfg.hidden_size
    assert tensors["markov_w1.weight"].shape.tolist() == [rank, cfg.target_vocab_size]  # ggml ne order
    assert tensors["markov_w2.weight"].shape.tolist() == [rank, cfg.draft_vocab_size]
    assert tensors["conf_proj.weight"].shape.tolist() == [hidden + rank, 1]
    assert tensors["output.weight"].shape.tolist() == [hidden, cfg.draft_vocab_size]
    assert "t2d" not in tensors


def test_gguf_cannot_carry_gated_heads_and_says_what_it_drops(qwen3, tiny_target_dirs, tmp_path):
    tok = resolve_tokenizer(tiny_target_dirs["qwen3"])
    with pytest.raises(DSparkError, match="vanilla Markov head only"):
        export_gguf(make_drafter(qwen3, markov_head_type="gated"), tmp_path / "g.gguf", tokenizer=tok)
    assert not (tmp_path / "g.gguf").exists()
    report = export_gguf(make_drafter(qwen3, confidence_head_with_markov=False), tmp_path / "c.gguf", tokenizer=tok)
    assert any("confidence_head.proj" in d for d in report.dropped)
    assert not read_gguf(tmp_path / "c.gguf").config.enable_confidence_head


# ---------------------------------------------------------------------------- imports
def _write_flat(model, directory, *, kind):
    """Write ``model`` the way z-lab (dflash) or DeepSpec (deepspec) checkpoints look."""
    cfg = model.config
    directory.mkdir()
    data = {
        "architectures": ["DFlashDraftModel" if kind == "dflash" else "Qwen3DSparkModel"],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.target_vocab_size,
        "block_size": cfg.block_size,
        "dflash_config": {
            "target_layer_ids": [i - 1 for i in cfg.aux_hidden_state_layer_ids],  # hidden_states[id + 1]
            "mask_token_id": cfg.mask_token_id,
        },
    }
    if kind == "deepspec":
        data.update(draft_vocab_size=cfg.draft_vocab_size, markov_rank=cfg.markov_rank, markov_head_type="vanilla")
    state = {
        f"model.{k}": v.contiguous()
        for k, v in model.state_dict().items()
        if k != "embed_tokens.weight" and not (kind == "dflash" and k in ("d2t", "t2d", "lm_head.weight"))
    }
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(data))


def test_import_zlab_dflash(qwen3, facts, tmp_path):
    model = make_drafter(qwen3, pruned=False, markov_rank=0, enable_confidence_head=False, sample_from_anchor=False)
    _write_flat(model, tmp_path / "zlab", kind="dflash")
    back = import_drafter(
        tmp_path / "zlab",
        "dflash",
        num_target_layers=facts.num_layers,
        target_embedding=facts.embedding,
        target_lm_head=facts.lm_head,
    )
    assert back.config.aux_hidden_state_layer_ids == model.config.aux_hidden_state_layer_ids
    assert back.config.sample_from_anchor is False and back.config.method == "dflash"
    assert_same_outputs(model, back)


def test_import_deepspec_dspark(qwen3, facts, tmp_path):
    model = make_drafter(qwen3)
    _write_flat(model, tmp_path / "ds", kind="deepspec")
    back = import_drafter(
        tmp_path / "ds", "deepspec", num_target_layers=facts.num_layers, target_embedding=facts.embedding
    )
    assert back.config.sample_from_anchor is True and back.config.enable_confidence_head
    assert_same_outputs(model, back)


def test_import_foreign_speculators_needs_the_target(qwen3, tiny_target_dirs, tmp_path):
    model = make_drafter(qwen3)
    export_speculators(model, tmp_path / "s", dtype=torch.float32, force=False)
    data = json.loads((tmp_path / "s" / "config.json").read_text())
    del data["dspark"]  # as speculators itself writes it
    (tmp_path / "s" / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="pass the target"):
        open_drafter(tmp_path / "s")
    back = open_drafter(tmp_path / "s", target=read_target_facts(tiny_target_dirs["qwen3"]))
    assert_same_outputs(model, back)


def test_cli_import_and_export(qwen3, tiny_target_dirs, tmp_path):
    model = make_drafter(qwen3)
    _write_flat(model, tmp_path / "ds", kind="deepspec")
    target = str(tiny_target_dirs["qwen3"])
    result = runner.invoke(
        app, ["import", str(tmp_path / "ds"), "--from", "deepspec", "--out", str(tmp_path / "o"), "--target", target]
    )
    assert result.exit_code == 0, result.output
    assert "aux ids" in result.output
    again = runner.invoke(
        app, ["import", str(tmp_path / "ds"), "--from", "deepspec", "--out", str(tmp_path / "o"), "--target", target]
    )
    assert again.exit_code == 2 and "--force" in again.output  # nothing overwritten
    result = runner.invoke(
        app,
        [
            "export",
            str(tmp_path / "o"),
            "--format",
            "gguf",
            "--outtype",
            "q8_0",
            "--out",
            str(tmp_path / "d.gguf"),
            "--target",
            target,
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["tensors"]["blk.0.attn_q.weight"] == "Q8_0"
    info = runner.invoke(app, ["inspect", str(tmp_path / "d.gguf"), "--json"])
    assert info.exit_code == 0, info.output
    assert json.loads(info.output)["format"] == "gguf"


# ---------------------------------------------------------------------------- damage
def _inspect(path, *extra):
    result = runner.invoke(app, ["inspect", str(path), *extra])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error:") and "Traceback" not in result.output
    return result.output


def test_damaged_inputs_give_clear_errors(qwen3, tiny_target_dirs, tmp_path):
    model = make_drafter(qwen3)
    save_drafter(model, tmp_path / "ok")
    export_gguf(model, tmp_path / "ok.gguf", outtype="f32", tokenizer=resolve_tokenizer(tiny_target_dirs["qwen3"]))
    # truncated safetensors
    bad = tmp_path / "trunc"
    bad.mkdir()
    (bad / "config.json").write_text((tmp_path / "ok" / "config.json").read_text())
    (bad / WEIGHTS_NAME).write_bytes((tmp_path / "ok" / WEIGHTS_NAME).read_bytes()[:5000])
    assert "truncated or corrupt" in _inspect(bad)
    # wrong d2t (absolute ids where offsets belong)
    state = load_file(str(tmp_path / "ok" / WEIGHTS_NAME))
    (tmp_path / "d2t").mkdir()
    (tmp_path / "d2t" / "config.json").write_text((tmp_path / "ok" / "config.json").read_text())
    save_file({**state, "d2t": torch.arange(0, 300, 2)}, str(tmp_path / "d2t" / WEIGHTS_NAME))
    assert "d2t" in _inspect(tmp_path / "d2t")
    # wrong shape
    (tmp_path / "shape").mkdir()
    (tmp_path / "shape" / "config.json").write_text((tmp_path / "ok" / "config.json").read_text())
    save_file({**state, "markov_head.markov_w2.weight": torch.zeros(150, 8)}, str(tmp_path / "shape" / WEIGHTS_NAME))
    assert "markov_head.markov_w2.weight has shape" in _inspect(tmp_path / "shape")
    # unknown architecture
    data = json.loads((tmp_path / "ok" / "config.json").read_text())
    data["speculators_model_type"] = "medusa"
    (tmp_path / "arch").mkdir()
    (tmp_path / "arch" / "config.json").write_text(json.dumps(data))
    (tmp_path / "arch" / WEIGHTS_NAME).write_bytes((tmp_path / "ok" / WEIGHTS_NAME).read_bytes())
    assert "medusa" in _inspect(tmp_path / "arch")
    # mask token outside the target vocab
    data = json.loads((tmp_path / "ok" / "config.json").read_text())
    data["mask_token_id"] = 10**6
    (tmp_path / "arch" / "config.json").write_text(json.dumps(data))
    assert "mask_token_id" in _inspect(tmp_path / "arch")
    # a GGUF with a missing tensor, a truncated GGUF, a GGUF of another architecture
    import gguf

    reader = gguf.GGUFReader(str(tmp_path / "ok.gguf"))
    writer = gguf.GGUFWriter(str(tmp_path / "missing.gguf"), "dflash")
    for key, fld in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = fld.types[0]
        sub = fld.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, fld.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        if t.name != "blk.1.ffn_down.weight":
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "layers.1.mlp.down_proj.weight" in _inspect(tmp_path / "missing.gguf")
    (tmp_path / "trunc.gguf").write_bytes((tmp_path / "ok.gguf").read_bytes()[:20000])
    assert "GGUF" in _inspect(tmp_path / "trunc.gguf")
    # a drafter checked against a target it was not made for
    import shutil

    other = tmp_path / "deeper-target"
    shutil.copytree(tiny_target_dirs["qwen3"], other)
    config = json.loads((other / "config.json").read_text())
    config["num_hidden_layers"] += 2
    (other / "config.json").write_text(json.dumps(config))
    assert "layer" in _inspect(tmp_path / "ok", "--target", str(other))


def _strings(value):
    """Every string inside a JSON value (keys and values)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _machine_paths(strings, *roots):
    """Absolute paths (POSIX or Windows) or any of ``roots`` inside the strings."""
    import re

    windows = re.compile(r"^[A-Za-z]:[\\/]")
    return [s for s in strings if s.startswith("/") or windows.match(s) or any(str(r) in s for r in roots)]


def test_no_machine_paths_in_shipped_or_exported_drafters(tiny_target_dirs, tmp_path):
    from pathlib import Path

    import gguf

    from dspark.defaults import DEFAULT_TARGET_PUBLIC_NAME

    repo = Path(__file__).resolve().parents[1]
    shipped = sorted((repo / "models").rglob("*.json"))
    assert shipped
    for path in shipped:
        assert _machine_paths(_strings(json.loads(path.read_text())), Path.home()) == [], path
    for config in (repo / "models").glob("*/config.json"):
        verifier = json.loads(config.read_text())["speculators_config"]["verifier"]["name_or_path"]
        assert verifier == DEFAULT_TARGET_PUBLIC_NAME, config

    # Fresh exports of a drafter made in a temporary folder for a target in another one.
    target, draft = tiny_target_dirs["qwen3"], tmp_path / "draft"
    assert runner.invoke(app, ["init", "--target", str(target), "--out", str(draft)]).exit_code == 0
    spec, gguf_path = tmp_path / "spec", tmp_path / "d.gguf"
    for args in (["--format", "speculators", "--out", str(spec)], ["--format", "gguf", "--out", str(gguf_path)]):
        result = runner.invoke(app, ["export", str(draft), "--target", str(target), *args])
        assert result.exit_code == 0, result.output
    for path in (draft / "config.json", spec / "config.json"):
        data = json.loads(path.read_text())
        assert data["speculators_config"]["verifier"]["name_or_path"] == target.name  # the folder name
        assert _machine_paths(_strings(data), tmp_path, target.parent) == [], path
    reader = gguf.GGUFReader(str(gguf_path))
    texts = []
    for name, field in reader.fields.items():
        if name.startswith("tokenizer.ggml."):
            continue  # the vocabulary itself
        value = field.contents()
        texts += list(_strings(value))
    assert any("speculators_config" in t for t in texts)  # the carried config is among them
    assert _machine_paths(texts, tmp_path, target.parent) == []
