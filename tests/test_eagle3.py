"""EAGLE-3 peer: training-time test == chain drafting, checkpoint round trip, engine losslessness."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.decoding.drafters import Eagle3Drafter
from dspark.decoding.sampling import SamplingParams
from dspark.errors import CheckpointError
from dspark.formats.checkpoint import load_drafter, save_drafter
from dspark.model.eagle3 import Eagle3Config, Eagle3DraftModel, train_forward
from dspark.model.vocab import identity_mapping

V, H, M = 50, 32, 3


def tiny(steps: int = 4, seed: int = 0) -> Eagle3DraftModel:
    torch.manual_seed(seed)
    cfg = Eagle3Config(
        hidden_size=H,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        draft_vocab_size=V,
        target_vocab_size=V,
        target_hidden_size=H,
        aux_hidden_state_layer_ids=(1, 2, 3),
        num_target_layers=4,
        speculative_steps=steps,
        rope_theta=10000.0,
    )
    model = Eagle3DraftModel(cfg)
    model.set_vocab_mapping(*identity_mapping(V))
    with torch.no_grad():
        model.embed_tokens.weight.normal_()
        model.lm_head.weight.normal_(std=0.5)
    return model.eval()


def chain_probs(model, ids, aux, p, prev):
    with torch.no_grad():
        logits = train_forward(model, aux, ids, torch.zeros_like(ids), torch.tensor([p]), prev[None])
    return torch.softmax(logits[0], dim=-1)


def test_training_time_test_matches_chain_drafting():
    model = tiny()
    torch.manual_seed(1)
    t = 24
    ids, aux = torch.randint(0, V, (t,)), torch.randn(t, M * H)
    drafter = Eagle3Drafter(model, target_vocab_size=V)
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    p = 9
    drafter.begin(ids[:p], aux[:p])
    prop = drafter.propose(int(ids[p]), 4, params, gen)
    prev = torch.cat([ids[p : p + 1], prop.tokens[:3]])
    torch.testing.assert_close(prop.probs, chain_probs(model, ids, aux, p, prev), atol=1e-5, rtol=1e-4)
    # After accepting anchor + 2 tokens, the next chain starts at p + 3 and sees them all.
    drafter.accept(ids[p : p + 3], aux[p : p + 3])
    prop = drafter.propose(int(ids[p + 3]), 4, params, gen)
    prev = torch.cat([ids[p + 3 : p + 4], prop.tokens[:3]])
    torch.testing.assert_close(prop.probs, chain_probs(model, ids, aux, p + 3, prev), atol=1e-5, rtol=1e-4)


def test_verified_tokens_kept_for_later_draft_as_if_added_at_once():
    """Accepts with no drafting between them (a batch step of length zero) join the cache at
    the next proposal; the chain equals the training-time one over every token so far."""
    model = tiny()
    torch.manual_seed(3)
    ids, aux = torch.randint(0, V, (30,)), torch.randn(30, M * H)
    drafter = Eagle3Drafter(model, target_vocab_size=V)
    params, p = SamplingParams(temperature=1.0), 6
    drafter.begin(ids[:p], aux[:p])
    for a, b in ((p, p + 1), (p + 1, p + 4), (p + 4, p + 6)):  # three steps, no proposal
        drafter.accept(ids[a:b], aux[a:b])
    prop = drafter.propose(int(ids[p + 6]), 4, params, torch.Generator().manual_seed(0))
    prev = torch.cat([ids[p + 6 : p + 7], prop.tokens[:3]])
    torch.testing.assert_close(prop.probs, chain_probs(model, ids, aux, p + 6, prev), atol=1e-5, rtol=1e-4)


def test_chains_do_not_see_other_documents_or_the_future():
    model = tiny()
    torch.manual_seed(2)
    t = 20
    ids, aux = torch.randint(0, V, (t,)), torch.randn(t, M * H)
    prev = ids[6:10]
    base = chain_probs(model, ids, aux, 6, prev)
    aux2 = aux.clone()
    aux2[7:] = torch.randn(t - 7, M * H)  # features after the chain start must not matter
    torch.testing.assert_close(base, chain_probs(model, ids, aux2, 6, prev))
    docs = torch.zeros(t, dtype=torch.long)
    docs[3:] = 1
    with torch.no_grad():
        a = train_forward(model, aux, ids, docs, torch.tensor([6]), prev[None])
        aux3 = aux.clone()
        aux3[:3] = torch.randn(3, M * H)  # another document's features must not matter either
        b = train_forward(model, aux3, ids, docs, torch.tensor([6]), prev[None])
    torch.testing.assert_close(a, b)


def test_checkpoint_round_trip_in_speculators_eagle3_layout(tmp_path):
    model = tiny(steps=5)
    save_drafter(model, tmp_path / "e3", include_embeddings=False)
    data = json.loads((tmp_path / "e3" / "config.json").read_text())
    assert data["speculators_model_type"] == "eagle3"
    assert data["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert data["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    back = load_drafter(tmp_path / "e3", target_embedding=model.embed_tokens.weight)
    assert isinstance(back, Eagle3DraftModel) and back.config == model.config
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor, rtol=0, atol=0)
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "e3" / "model.safetensors")))
    assert {"fc.weight", "layers.0.hidden_norm.weight", "layers.0.self_attn.q_proj.weight", "lm_head.weight"} <= names
    assert load_file(str(tmp_path / "e3" / "model.safetensors"))["layers.0.self_attn.q_proj.weight"].shape == (32, 64)


def test_damaged_eagle3_config_is_named(tmp_path):
    save_drafter(tiny(), tmp_path / "e3")
    path = tmp_path / "e3" / "config.json"
    data = json.loads(path.read_text())
    data["norm_before_residual"] = True
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="norm_before_residual"):
        load_drafter(tmp_path / "e3")


def test_eagle3_gguf_export_is_refused_by_name(tmp_path):
    from dspark.errors import DSparkError
    from dspark.formats.gguf import export_gguf

    with pytest.raises(DSparkError, match="eagle3 drafter stays in the speculators format"):
        export_gguf(tiny(), tmp_path / "e3.gguf", tokenizer=None)
    assert not (tmp_path / "e3.gguf").exists()
