"""Target adapter: aux-layer indexing against transformers, and KV-cache crop correctness."""

import pytest
import torch

from dspark.target import TargetError

ARCHS = ["llama", "qwen3", "deepseek_v3"]


@pytest.mark.parametrize("arch", ARCHS)
def test_aux_layer_ids_index_hf_hidden_states(tiny_targets, arch):
    target = tiny_targets[arch]
    ids = [0, 1, target.num_layers - 1, target.num_layers]
    target.set_aux_layers(ids)
    tokens = torch.tensor(target.tokenizer("The answer is 42.")["input_ids"])
    target.reset()
    step = target.forward(tokens, capture=True)
    with torch.inference_mode():
        hs = target.model(input_ids=tokens[None], output_hidden_states=True).hidden_states
    h = target.hidden_size
    for j, layer_id in enumerate(ids):
        torch.testing.assert_close(step.aux_hidden[:, j * h : (j + 1) * h], hs[layer_id][0], rtol=1e-5, atol=1e-5)


def test_aux_layer_id_out_of_range_is_a_clear_error(tiny_targets):
    target = tiny_targets["llama"]
    with pytest.raises(TargetError, match=r"outside \[0, 4\]"):
        target.set_aux_layers([1, 5])


@pytest.mark.parametrize("arch", ARCHS)
def test_crop_then_extend_matches_a_fresh_forward(tiny_targets, arch):
    target = tiny_targets[arch]
    target.set_aux_layers([1, 2])
    seq = torch.tensor(target.tokenizer("Natalia sold clips to 48 of her friends")["input_ids"])
    wrong = torch.tensor([5, 6, 7, 8])
    n = seq.shape[0] - 3
    target.reset()
    target.forward(seq[:n])
    target.forward(wrong)  # a rejected draft
    assert target.cache_len == n + 4
    target.crop(n)
    assert target.cache_len == n
    tail = target.forward(seq[n:], capture=True)
    target.reset()
    fresh = target.forward(seq, capture=True)
    torch.testing.assert_close(tail.logits, fresh.logits[n:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(tail.aux_hidden, fresh.aux_hidden[n:], rtol=1e-4, atol=1e-4)


def test_crop_cannot_grow_the_cache(tiny_targets):
    target = tiny_targets["llama"]
    target.reset()
    target.forward(torch.tensor([3, 4, 5]))
    with pytest.raises(ValueError, match="cannot crop"):
        target.crop(5)


def test_missing_target_directory_is_a_clear_error(tmp_path):
    from dspark.target import TargetModel

    with pytest.raises(TargetError, match="not found"):
        TargetModel.from_pretrained(tmp_path / "nope")
    with pytest.raises(TargetError, match=r"no config\.json"):
        TargetModel.from_pretrained(tmp_path)
