"""DSparkConfig validates itself and round-trips through JSON."""

import json

import pytest

from dspark.errors import ConfigError
from dspark.formats.checkpoint import load_config, save_config
from dspark.model.config import DSparkConfig

BASE = dict(
    num_hidden_layers=1,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    draft_vocab_size=300,
    target_vocab_size=320,
    target_hidden_size=64,
    aux_hidden_state_layer_ids=[1, 2, 3],
    num_target_layers=4,
    mask_token_id=2,
)


def test_round_trip(tmp_path):
    cfg = DSparkConfig(**BASE)
    save_config(cfg, tmp_path)
    assert load_config(tmp_path) == cfg
    assert cfg.drafts_per_block == 8
    assert cfg.replace(sample_from_anchor=False).drafts_per_block == 7
    assert cfg.method == "dspark"
    assert cfg.replace(markov_rank=0, enable_confidence_head=False).method == "dflash"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(aux_hidden_state_layer_ids=[1, 5]), r"outside \[0, 4\]"),
        (dict(aux_hidden_state_layer_ids=[1, 1]), "duplicates"),
        (dict(aux_hidden_state_layer_ids=[]), "at least one"),
        (dict(num_key_value_heads=3), "multiple"),
        (dict(hidden_size=32), "target_hidden_size"),
        (dict(draft_vocab_size=400), "exceeds"),
        (dict(mask_token_id=320), "mask_token_id"),
        (dict(markov_rank=0), "confidence_head_with_markov"),
        (dict(markov_head_type="lstm"), "markov_head_type"),
        (dict(block_size=1, sample_from_anchor=False), "no draft slot"),
        (dict(num_hidden_layers=0), "positive"),
        (dict(aux_layer_id_convention="deepspec"), "convention"),
    ],
)
def test_invalid_fields_are_named(change, message):
    with pytest.raises(ConfigError, match=message):
        DSparkConfig(**{**BASE, **change})


def test_unknown_and_missing_keys_are_errors(tmp_path):
    data = DSparkConfig(**BASE).to_dict()
    with pytest.raises(ConfigError, match="unknown"):
        DSparkConfig.from_dict({**data, "block_sise": 8})
    data.pop("hidden_size")
    with pytest.raises(ConfigError, match="missing"):
        DSparkConfig.from_dict(data)


def test_missing_and_corrupt_config_files(tmp_path):
    with pytest.raises(ConfigError, match="no drafter config"):
        load_config(tmp_path)
    (tmp_path / DSparkConfig.FILE_NAME).write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path)
    (tmp_path / DSparkConfig.FILE_NAME).write_text(json.dumps([1, 2]))
    with pytest.raises(ConfigError, match="JSON object"):
        load_config(tmp_path)
