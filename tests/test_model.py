"""The drafter model: attention against a slow reference, the context cache, pruned vocab, dtypes."""

import math

import pytest
import torch
from helpers import untrained_drafter
from test_config import BASE

from dspark.decoding import DSparkDrafter, SamplingParams, SpeculativeEngine
from dspark.model.config import DSparkConfig
from dspark.model.dspark import DSparkDraftModel, apply_rotary, rotary_cos_sin
from dspark.model.vocab import draft_to_target_ids, mapping_from_kept_ids


def slow_attention(attn, x, positions, ctx, ctx_positions):
    """Per-head, per-query loops: queries from the block; keys/values = [ctx ; block]."""
    d, groups = attn.head_dim, attn.num_heads // attn.num_kv_heads
    kv_in = torch.cat([ctx, x], dim=1)[0]
    kv_pos = torch.cat([ctx_positions, positions])
    out = torch.zeros(x.shape[1], attn.num_heads * d)
    for h in range(attn.num_heads):
        g = h // groups
        cos_q, sin_q = rotary_cos_sin(positions, d, attn.rope_theta)
        cos_k, sin_k = rotary_cos_sin(kv_pos, d, attn.rope_theta)
        q = attn.q_norm(attn.q_proj(x[0])[:, h * d : (h + 1) * d])
        k = attn.k_norm(attn.k_proj(kv_in)[:, g * d : (g + 1) * d])
        v = attn.v_proj(kv_in)[:, g * d : (g + 1) * d]
        q = apply_rotary(q[None, None], cos_q, sin_q)[0, 0]
        k = apply_rotary(k[None, None], cos_k, sin_k)[0, 0]
        for i in range(x.shape[1]):
            w = torch.softmax(torch.stack([q[i] @ k[j] for j in range(k.shape[0])]) / math.sqrt(d), dim=0)
            out[i, h * d : (h + 1) * d] = (w[:, None] * v).sum(0)
    return attn.o_proj(out)


def test_attention_matches_slow_reference():
    torch.manual_seed(0)
    model = DSparkDraftModel(DSparkConfig(**BASE))
    attn = model.layers[0].self_attn
    ctx, x = torch.randn(1, 6, 64), torch.randn(1, 8, 64)
    ctx_pos, pos = torch.arange(6), torch.arange(6, 14)
    k, v = attn.context_kv(ctx, ctx_pos)
    with torch.no_grad():
        fast = attn(x, pos, k, v)[0]
        slow = slow_attention(attn, x, pos, ctx, ctx_pos)
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-5)


def test_context_cache_grown_in_steps_equals_one_shot(tiny_targets):
    target = tiny_targets["llama"]
    model = untrained_drafter(target)
    aux = torch.randn(11, 3 * target.hidden_size)
    stepwise = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    stepwise.begin(torch.arange(4), aux[:4])
    stepwise.accept(torch.arange(3), aux[4:7])
    stepwise.accept(torch.arange(4), aux[7:])
    oneshot = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    oneshot.begin(torch.arange(11), aux)
    p = SamplingParams()
    assert stepwise.propose(5, 8, p, None).tokens.tolist() == oneshot.propose(5, 8, p, None).tokens.tolist()
    for (k1, v1), (k2, v2) in zip(stepwise._kv, oneshot._kv, strict=True):  # accepted rows joined at propose
        torch.testing.assert_close(k1, k2)
        torch.testing.assert_close(v1, v2)


def test_markov_head_changes_later_slots_only_through_prev_token(tiny_targets):
    """Slot 0's distribution depends on the anchor; with W2 zeroed the bias vanishes."""
    target = tiny_targets["llama"]
    model = untrained_drafter(target)
    drafter = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    drafter.begin(torch.arange(4), torch.randn(4, 3 * target.hidden_size))
    with_markov = drafter.propose(9, 8, SamplingParams(), None).tokens
    with torch.no_grad():
        model.markov_head.markov_w2.weight.zero_()
    without = drafter.propose(9, 8, SamplingParams(), None).tokens
    block = model.block_input_ids(torch.tensor([9]))
    with torch.inference_mode():
        h = model.backbone(block, torch.arange(4, 12), drafter._kv)[0]
    assert without.tolist() == model.base_logits(h).argmax(-1).tolist()
    assert with_markov.shape == without.shape


def test_pruned_vocab_drafts_are_target_ids_and_lossless(tiny_targets):
    target = tiny_targets["qwen3"]
    model = untrained_drafter(target, draft_vocab_size=64)
    d2t, t2d = mapping_from_kept_ids(
        torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(3))[:64], target.vocab_size
    )
    model.set_vocab_mapping(d2t, t2d)
    model.copy_target_weights(target.embedding_weight().detach(), target.lm_head_weight().detach())
    drafter = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    kept = set(draft_to_target_ids(d2t).tolist())
    prompt = target.tokenizer("def add(a, b):")["input_ids"]
    drafter.begin(torch.tensor(prompt), torch.randn(len(prompt), 3 * target.hidden_size))
    gen = torch.Generator().manual_seed(0)
    prop = drafter.propose(prompt[-1], 6, SamplingParams(temperature=0.9), gen)
    assert set(prop.tokens.tolist()) <= kept
    assert prop.probs.shape == (6, target.vocab_size)
    torch.testing.assert_close(prop.probs.sum(-1), torch.ones(6))
    assert float(prop.probs[:, ~t2d].abs().sum()) == 0.0
    plain = SpeculativeEngine(target).generate(prompt, max_new_tokens=24, stop_token_ids=set())
    spec = SpeculativeEngine(target, drafter, num_speculative_tokens=6).generate(
        prompt, max_new_tokens=24, stop_token_ids=set()
    )
    assert spec.tokens == plain.tokens


def test_lm_head_rows_follow_t2d(tiny_targets):
    target = tiny_targets["qwen3"]
    model = untrained_drafter(target, draft_vocab_size=64)
    d2t, t2d = mapping_from_kept_ids(torch.arange(100, 164), target.vocab_size)
    model.set_vocab_mapping(d2t, t2d)
    model.copy_target_weights(target.embedding_weight().detach(), target.lm_head_weight().detach())
    torch.testing.assert_close(model.lm_head.weight, target.lm_head_weight()[100:164])
    assert not model.lm_head.weight.requires_grad and not model.embed_tokens.weight.requires_grad


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_drafter_runs_in_low_precision(tiny_targets, dtype):
    target = tiny_targets["llama"]
    model = untrained_drafter(target).to(dtype)
    drafter = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    drafter.begin(torch.arange(5), torch.randn(5, 3 * target.hidden_size))
    prop = drafter.propose(3, 8, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert len(prop) == 8
    torch.testing.assert_close(prop.probs.sum(-1), torch.ones(8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="gpu: needs CUDA")
def test_lossless_on_cuda(tiny_target_dirs):
    from dspark.target import TargetModel

    target = TargetModel.from_pretrained(tiny_target_dirs["qwen3"], device="cuda")
    model = untrained_drafter(target).to("cuda")
    prompt = target.tokenizer("def add(a, b):")["input_ids"]
    plain = SpeculativeEngine(target).generate(prompt, max_new_tokens=24, stop_token_ids=set())
    spec = SpeculativeEngine(
        target, DSparkDrafter(model, target_vocab_size=target.vocab_size), num_speculative_tokens=7
    ).generate(prompt, max_new_tokens=24, stop_token_ids=set())
    assert spec.tokens == plain.tokens
