"""Checkpoints: round trip, and every kind of damage gives a clear error."""

import json

import pytest
import torch
from helpers import untrained_drafter
from safetensors.torch import load_file, save_file

from dspark.errors import CheckpointError, IncompatibleDraftError
from dspark.formats.checkpoint import WEIGHTS_NAME, load_drafter, save_drafter
from dspark.model.config import DSparkConfig
from dspark.model.pairing import check_fits


@pytest.fixture
def saved(tiny_targets, tmp_path):
    model = untrained_drafter(tiny_targets["qwen3"])
    save_drafter(model, tmp_path / "d")
    return model, tmp_path / "d"


def block_logits(model):
    torch.manual_seed(0)
    cfg = model.config
    aux = torch.randn(1, 5, len(cfg.aux_hidden_state_layer_ids) * cfg.target_hidden_size)
    ctx = model.project_context(aux)
    kv = model.context_kv(ctx, torch.arange(5))
    with torch.inference_mode():
        return model.base_logits(model.backbone(model.block_input_ids(torch.tensor([7])), torch.arange(5, 13), kv))


def test_round_trip_gives_identical_logits(saved):
    model, path = saved
    loaded = load_drafter(path)
    assert loaded.config == model.config
    assert torch.equal(block_logits(model), block_logits(loaded))


def test_bf16_storage_loads(saved, tmp_path):
    model, _ = saved
    save_drafter(model, tmp_path / "bf16", dtype=torch.bfloat16)
    state = load_file(str(tmp_path / "bf16" / WEIGHTS_NAME))
    assert state["fc.weight"].dtype == torch.bfloat16
    assert "d2t" not in state and "t2d" not in state  # full vocab: speculators writes no tables
    loaded = load_drafter(tmp_path / "bf16", dtype=torch.float32)
    torch.testing.assert_close(block_logits(loaded), block_logits(model), rtol=0.05, atol=0.05)


def test_truncated_weights(saved):
    _, path = saved
    data = (path / WEIGHTS_NAME).read_bytes()
    (path / WEIGHTS_NAME).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_drafter(path)


def test_missing_weights_and_config(saved):
    _, path = saved
    (path / WEIGHTS_NAME).unlink()
    with pytest.raises(CheckpointError, match="weights file missing"):
        load_drafter(path)
    (path / DSparkConfig.FILE_NAME).unlink()
    with pytest.raises(CheckpointError, match="no drafter config"):
        load_drafter(path)


def test_wrong_shape_and_missing_tensor(saved):
    _, path = saved
    state = load_file(str(path / WEIGHTS_NAME))
    state["fc.weight"] = state["fc.weight"][:, :10].contiguous()
    save_file(state, str(path / WEIGHTS_NAME))
    with pytest.raises(CheckpointError, match=r"fc\.weight has shape"):
        load_drafter(path)
    del state["fc.weight"]
    save_file(state, str(path / WEIGHTS_NAME))
    with pytest.raises(CheckpointError, match="missing"):
        load_drafter(path)


def test_absolute_ids_in_d2t_are_caught(tiny_targets, tmp_path):
    target = tiny_targets["qwen3"]
    model = untrained_drafter(target, draft_vocab_size=100)
    save_drafter(model, tmp_path / "p")
    state = load_file(str(tmp_path / "p" / WEIGHTS_NAME))
    state["d2t"] = torch.arange(100) + 200  # absolute ids where offsets belong
    save_file(state, str(tmp_path / "p" / WEIGHTS_NAME))
    with pytest.raises(CheckpointError, match="d2t"):
        load_drafter(tmp_path / "p")


def test_config_that_disagrees_with_weights(saved):
    _, path = saved
    data = json.loads((path / DSparkConfig.FILE_NAME).read_text())
    data["transformer_layer_config"]["intermediate_size"] = 96
    (path / DSparkConfig.FILE_NAME).write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="has shape"):
        load_drafter(path)


@pytest.mark.parametrize("other", ["llama", "deepseek_v3"])
def test_drafter_for_another_target_is_refused(tiny_targets, saved, other):
    model, _ = saved
    config = model.config.replace(target_vocab_size=model.config.target_vocab_size + 8)
    with pytest.raises(IncompatibleDraftError, match="vocab size"):
        check_fits(config, tiny_targets[other])


def test_hidden_size_and_layer_mismatch_are_named(tiny_targets, saved):
    model, _ = saved
    cfg = model.config
    with pytest.raises(IncompatibleDraftError, match="hidden size"):
        check_fits(cfg.replace(hidden_size=32, target_hidden_size=32, head_dim=8), tiny_targets["llama"])
    with pytest.raises(IncompatibleDraftError, match="layer count"):
        check_fits(cfg.replace(num_target_layers=8, aux_hidden_state_layer_ids=(1, 7)), tiny_targets["llama"])


def test_checkpoint_without_embeddings_takes_them_from_the_target(tiny_targets, saved, tmp_path):
    model, _ = saved
    target = tiny_targets["qwen3"]
    save_drafter(model, tmp_path / "small", include_embeddings=False)
    assert "embed_tokens.weight" not in load_file(str(tmp_path / "small" / WEIGHTS_NAME))
    with pytest.raises(CheckpointError, match="pass the target"):
        load_drafter(tmp_path / "small")
    with pytest.raises(CheckpointError, match=r"embed_tokens\.weight has shape"):
        load_drafter(tmp_path / "small", target_embedding=torch.zeros(3, 3))
    loaded = load_drafter(tmp_path / "small", target_embedding=target.embedding_weight())
    assert torch.equal(block_logits(loaded), block_logits(model))


def test_pruned_vocab_tables_are_stored_as_speculators_does(tiny_targets, tmp_path):
    model = untrained_drafter(tiny_targets["qwen3"], draft_vocab_size=100)
    save_drafter(model, tmp_path / "p", dtype=torch.bfloat16)
    state = load_file(str(tmp_path / "p" / WEIGHTS_NAME))
    assert state["d2t"].dtype == torch.long and state["t2d"].dtype == torch.bool
    assert state["lm_head.weight"].shape == (100, model.config.hidden_size)
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert config["speculators_model_type"] == "dspark" and config["draft_vocab_size"] == 100
    assert config["transformer_layer_config"]["vocab_size"] == model.config.target_vocab_size
    assert config["sample_from_anchor"] is True  # written explicitly: engines disagree on its default


def test_checkpoints_in_the_older_dspark_config_format_still_load(saved):
    model, path = saved
    (path / "config.json").unlink()
    (path / "dspark_config.json").write_text(json.dumps(model.config.to_dict()))
    assert load_drafter(path).config == model.config
