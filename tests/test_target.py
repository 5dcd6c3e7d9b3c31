"""Target adapter: aux-layer indexing against transformers, and KV-cache crop correctness."""

import pytest
import torch

from dspark.target import TargetError

ARCHS = ["llama", "qwen3", "deepseek_v3"]


@pytest.mark.parametrize("arch", ARCHS)
def test_aux_layer_ids_index_hf_hidden_states(tiny_targets, arch):
    target = tiny_targets[arch]
    ids = [0, 1, target.num_layers - 1, target.num_layers]
    tokens = torch.tensor(target.tokenizer("The answer is 42.")["input_ids"])
    target.reset()
    step = target.forward(tokens, capture=ids)
    with torch.inference_mode():
        hs = target.model(input_ids=tokens[None], output_hidden_states=True).hidden_states
    h = target.hidden_size
    for j, layer_id in enumerate(ids):
        torch.testing.assert_close(step.aux_hidden[:, j * h : (j + 1) * h], hs[layer_id][0], rtol=1e-5, atol=1e-5)


def test_aux_layer_id_out_of_range_is_a_clear_error(tiny_targets):
    target = tiny_targets["llama"]
    with pytest.raises(TargetError, match=r"outside \[0, 4\]"):
        target.check_layer_ids([1, 5])
    target.reset()
    with pytest.raises(TargetError, match=r"outside \[0, 4\]"):
        target.forward(torch.tensor([1, 2]), capture=[1, 5])


@pytest.mark.parametrize("arch", ARCHS)
def test_crop_then_extend_matches_a_fresh_forward(tiny_targets, arch):
    target = tiny_targets[arch]
    seq = torch.tensor(target.tokenizer("Natalia sold clips to 48 of her friends")["input_ids"])
    wrong = torch.tensor([5, 6, 7, 8])
    n = seq.shape[0] - 3
    target.reset()
    target.forward(seq[:n])
    target.forward(wrong)  # a rejected draft
    assert target.cache_len == n + 4
    target.crop(n)
    assert target.cache_len == n
    tail = target.forward(seq[n:], capture=(1, 2))
    target.reset()
    fresh = target.forward(seq, capture=(1, 2))
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


@pytest.mark.parametrize("arch", ARCHS)
def test_deferred_head_gives_the_models_own_logits(tiny_targets, arch):
    """The output projection runs only for the rows asked for, and they are the model's logits."""
    target = tiny_targets[arch]
    tokens = torch.tensor(target.tokenizer("The answer is 42. #### 42")["input_ids"])
    target.reset()
    step = target.forward(tokens)
    assert step.deferred and len(step) == tokens.shape[0]
    with torch.inference_mode():
        full = target.model(input_ids=tokens[None]).logits[0].float()
    torch.testing.assert_close(step.rows(-1), full[-1:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step.rows(1, 3), full[1:3], rtol=1e-5, atol=1e-5)
    assert step.deferred  # rows() computed only those rows
    torch.testing.assert_close(step.logits, full, rtol=1e-5, atol=1e-5)
    assert not step.deferred


def test_a_model_that_post_processes_its_logits_falls_back_to_them(tiny_target_dirs):
    """Soft-capped logits are not head(norm(h)): the one-time check turns deferral off, exactly."""
    from transformers import AutoModelForCausalLM

    from dspark.target import TargetModel

    target = TargetModel.from_pretrained(tiny_target_dirs["llama"])
    head = target.model.lm_head
    target.model.lm_head = torch.nn.Sequential(head, torch.nn.Tanh())  # logits the head alone does not give
    target._head = head
    tokens = torch.tensor(target.tokenizer("for i in range(10):")["input_ids"])
    target.reset()
    step = target.forward(tokens)
    assert target._deferred_ok is False and not step.deferred
    assert target.cache_len == tokens.shape[0]  # the retried forward did not double the cache
    fresh = AutoModelForCausalLM.from_pretrained(tiny_target_dirs["llama"])
    with torch.inference_mode():
        want = torch.tanh(fresh(input_ids=tokens[None]).logits[0].float())
    torch.testing.assert_close(step.logits, want, rtol=1e-5, atol=1e-5)


def test_a_model_that_refuses_an_index_list_falls_back_to_full_logits(tiny_target_dirs):
    from dspark.target import TargetModel

    target = TargetModel.from_pretrained(tiny_target_dirs["llama"])
    plain = target.model.forward

    def strict_forward(*args, logits_to_keep=0, **kwargs):
        if isinstance(logits_to_keep, torch.Tensor):
            raise TypeError("logits_to_keep must be an int")
        return plain(*args, logits_to_keep=logits_to_keep, **kwargs)

    target.model.forward = strict_forward
    tokens = torch.tensor(target.tokenizer("def add(a, b):")["input_ids"])
    target.reset()
    first = target.forward(tokens[:-2])  # the one-time check (logits_to_keep=1) passes
    assert target._deferred_ok and first.deferred
    second = target.forward(tokens[-2:])  # the empty index is refused: redone the plain way
    assert target._deferred_ok is False and not second.deferred
    assert target.cache_len == tokens.shape[0]
    target.reset()
    fresh = target.forward(tokens)
    torch.testing.assert_close(second.logits, fresh.logits[-2:], rtol=1e-4, atol=1e-4)


def test_one_prompt_encoding_for_every_path(tiny_target_dirs, tmp_path):
    """generate (chat or not), serve, bench and datagen all encode through encode_prompt."""
    from transformers import AutoTokenizer

    from dspark.interop.tiny_targets import SIMPLE_CHAT_TEMPLATE as TEMPLATE
    from dspark.interop.tiny_targets import with_chat_template
    from dspark.target.prompts import chat_prefix, encode_prompt

    plain = AutoTokenizer.from_pretrained(tiny_target_dirs["qwen3"])
    assert encode_prompt(plain, "def f():") == plain("def f():")["input_ids"]  # no template: the text
    chat = AutoTokenizer.from_pretrained(with_chat_template(tiny_target_dirs["qwen3"], tmp_path / "chat"))
    turn = [{"role": "user", "content": "def f():"}]
    assert encode_prompt(chat, "def f():") == encode_prompt(chat, turn)
    assert (
        encode_prompt(chat, "def f():")[0] == chat.eos_token_id
        and encode_prompt(chat, "def f():")[-1] == chat.mask_token_id
    )
    assert encode_prompt(chat, "def f():", chat=False) == chat("def f():")["input_ids"]
    # The prefix every chat turn starts with (a prefix cache's key): the template's system turn.
    system = AutoTokenizer.from_pretrained(
        with_chat_template(tiny_target_dirs["qwen3"], tmp_path / "system", "<eos>system: be brief.<eos>" + TEMPLATE)
    )
    head = chat_prefix(system)
    assert len(head) >= 4 and all(encode_prompt(system, t)[: len(head)] == head for t in ("def f():", "x", "1 2"))
    assert system.decode(head).startswith("<eos>system: be brief.")
    assert chat_prefix(plain) == [] and chat_prefix(chat) == []  # no template; a 1-token head


def test_each_forward_captures_the_layers_it_asks_for(tiny_targets):
    """The target holds no capture state: two callers with different layers share it safely
    (a drafter decoding while training's source captures others)."""
    target = tiny_targets["qwen3"]
    tokens = torch.tensor(target.tokenizer("one two three four")["input_ids"])
    h = target.hidden_size
    target.reset()
    both = target.forward(tokens, capture=(3, 1)).aux_hidden
    target.reset()
    first = target.forward(tokens, capture=(1,)).aux_hidden
    target.reset()
    assert target.forward(tokens).aux_hidden is None
    target.reset()
    third = target.forward(tokens, capture=[3]).aux_hidden
    assert both.shape[-1] == 2 * h
    torch.testing.assert_close(both[:, :h], third)
    torch.testing.assert_close(both[:, h:], first)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 64, 65])
@pytest.mark.parametrize("bias", [False, True])
def test_rows_first_linear_computes_the_linear_product(rows, bias):
    """W @ xᵀ for 1..64 float32 rows on CPU: F.linear's numbers up to rounding, its shape
    (leading dims kept), contiguous; longer inputs and other dtypes are F.linear itself."""
    import torch.nn.functional as F
    from torch import nn

    from dspark.target.small_rows import RowsFirstLinear, rows_first_linear

    torch.manual_seed(rows)
    layer = nn.Sequential(nn.Linear(48, 96, bias=bias))
    assert rows_first_linear(layer, True) == 1 and type(layer[0]) is RowsFirstLinear
    lin = layer[0]
    for shape in ((rows, 48), (1, rows, 48)):
        x = torch.randn(*shape)
        ref = F.linear(x, lin.weight, lin.bias)
        got = lin(x)
        assert got.shape == ref.shape and got.is_contiguous()
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        if rows > 64:
            assert torch.equal(got, ref)  # long inputs (prefill, features) take F.linear itself
    xb = torch.randn(rows, 48, dtype=torch.bfloat16)
    lin = lin.to(torch.bfloat16)
    if rows > 1:
        assert torch.equal(lin(xb), F.linear(xb, lin.weight, lin.bias))
    else:  # one bf16 row: the product of two rows (the kernel every batch of rows takes)
        assert torch.equal(lin(xb), F.linear(torch.cat([xb, xb]), lin.weight, lin.bias)[:1])
    assert rows_first_linear(layer, False) == 1 and type(layer[0]) is nn.Linear


def test_a_bf16_row_gives_the_same_product_alone_and_in_a_batch():
    """Alone, a bf16 row would take a matrix-vector kernel whose float32 sums run in another
    order than a matrix product's, and rounded to bf16 some outputs differ (about one in 6,000
    on the CPU this was written on): a request's text would depend on its batch. Every row
    now equals its row in any batch."""
    import torch.nn.functional as F
    from torch import nn

    from dspark.target.small_rows import rows_first_linear

    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(1536, 576, bias=False)).to(torch.bfloat16)
    rows_first_linear(layer, True)
    x = (torch.randn(256, 1536) * 3).to(torch.bfloat16)
    together = F.linear(x, layer[0].weight)
    alone = torch.cat([layer[0](x[i : i + 1]) for i in range(len(x))])
    assert torch.equal(alone, together)


def test_target_uses_rows_first_linear_unless_turned_off(tiny_target_dirs, monkeypatch):
    from torch import nn

    from dspark.target import TargetModel
    from dspark.target.small_rows import RowsFirstLinear

    def kinds(target):
        return {type(m) for m in target.model.modules() if isinstance(m, nn.Linear)}

    target = TargetModel.from_pretrained(tiny_target_dirs["llama"])
    assert target.small_rows and kinds(target) == {RowsFirstLinear}
    ids = torch.tensor([5, 9, 13, 2, 7, 11])
    on = target.forward(ids).logits
    target.set_small_rows(False)
    target.reset()
    assert not target.small_rows and kinds(target) == {nn.Linear}
    torch.testing.assert_close(target.forward(ids).logits, on, rtol=1e-4, atol=1e-4)
    monkeypatch.setenv("DSPARK_SMALL_ROWS", "0")
    assert kinds(TargetModel.from_pretrained(tiny_target_dirs["llama"])) == {nn.Linear}


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_bf16_logits_do_not_depend_on_how_the_sequence_was_split(tiny_target_dirs, arch):
    """The one-sequence engine's bf16 target gives a position the same logits, bit for bit,
    whether the sequence came in one forward, a token at a time, or in verification-sized
    blocks after a cropped draft: CPU attention goes through `block_attention`, whose sums do
    not depend on how many queries or keys come with a row (SDPA's do). So greedy
    speculative decoding equals plain decoding in bf16 too."""
    from dspark.target import TargetModel

    target = TargetModel.from_pretrained(tiny_target_dirs[arch], dtype=torch.bfloat16)
    assert target.block_attention and target.model.config._attn_implementation == "dspark_cpu"
    seq = torch.tensor([(11 * j) % 90 + 4 for j in range(40)])
    target.reset()
    whole = target.forward(seq).logits
    for split in ([30] + [1] * 10, [25, 4, 3, 8], [33, 7]):
        target.reset()
        parts, at = [], 0
        for n in split:
            target.forward(torch.tensor([7, 8, 9]))  # a draft, rejected
            target.crop(at)
            parts.append(target.forward(seq[at : at + n]).logits)
            at += n
        assert torch.equal(torch.cat(parts), whole), split


def test_block_attention_is_attention():
    """`block_attention` computes softmax(q kᵀ · scale + mask) v with grouped kv heads, as SDPA."""
    import torch.nn.functional as F

    from dspark.target.attention import CHUNK, block_attention, causal_mask

    torch.manual_seed(0)
    for w, span in ((1, 9), (5, 12), (CHUNK + 40, CHUNK + 50)):
        q = torch.randn(2, 6, w, 16)
        k, v = torch.randn(2, 3, span, 16), torch.randn(2, 3, span, 16)
        mask = causal_mask(w, span, q.device).expand(2, 1, w, span).clone()
        mask[1, :, :, 0] = False  # a key one sequence may not see
        got = block_attention(q, k, v, scale=0.3, mask=mask)
        ref = F.scaled_dot_product_attention(
            q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), attn_mask=mask, scale=0.3
        )
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        causal = block_attention(q[:1], k[:1], v[:1], scale=0.3)
        torch.testing.assert_close(causal, got[:1], rtol=1e-5, atol=1e-5)
