"""CPU attention that gives a sequence the same bits whatever else is computed beside it.

Every CPU attention of the target goes through `block_attention`: the slot decoder's
prefill, decode and verification steps (`dspark.target.slots`) and the Hugging Face model's
own layers in the one-sequence engine (registered as the ``dspark_cpu`` attention
implementation, `use_block_attention`). Two batched matmuls per layer (each kv head's query
group in one product) with the masked keys' weights exactly zero; measured on this CPU, a
query's result is the same whether the key block is its own length or padded to a batch's
longest sequence, and whatever the number of queries (2+ rows share one matrix-product
kernel). SDPA's CPU kernel splits the keys by the length it is given, so in bf16 its
results moved with the batch and with the query count, and a request's text depended on its
neighbours and on whether it was drafted for. With one function everywhere, a prompt's
prefill in one slot, a prefix-cached prefill, a one-token step and a verified block all
compute each row the same way; greedy speculative decoding equals plain decoding bit for
bit in bf16 too. Long query blocks (prompts) go in chunks of `CHUNK` queries, so the
scores never hold more than CHUNK x span per head.
"""

from __future__ import annotations

import torch

CHUNK = 256  # queries per product: bounds the scores' memory on long prompts
NAME = "dspark_cpu"  # the attention implementation name registered with transformers


# A masked key's score: its weight is exactly 0 beside any key a query may see, and a query
# that may see none (a padding row of a static batch) gets finite weights, not NaN (which
# would reach the other rows through 0 x NaN).
MASKED = -1e30


def block_bias(mask: torch.Tensor) -> torch.Tensor:
    """[n, 1, 1, w, span] float32: 0 where ``mask`` [n, 1, w, span] (bool) lets a query see a
    key, `MASKED` elsewhere (added to the scores of every kv head and query head)."""
    bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return bias.masked_fill_(~mask, MASKED)[:, :, None]


def causal_mask(w: int, span: int, device) -> torch.Tensor:
    """[1, 1, w, span]: the last ``w`` positions of ``span`` as queries, each seeing itself and
    everything before it."""
    keys = torch.arange(span, device=device)
    return (keys[None, :] <= (span - w + torch.arange(w, device=device))[:, None])[None, None]


def block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``q`` [n, H, w, D] over ``k`` / ``v`` [n, KV, span, D] (H a multiple of KV, query head h
    reads kv head h // (H / KV)); ``mask`` [n or 1, 1, w, span] bool (None: causal, the queries
    being the last w positions), or its ``bias`` (`block_bias`, made once per forward).
    Returns [n, H, w, D]."""
    n, heads, w, d = q.shape
    kv_heads, span = k.shape[1], k.shape[2]
    rep = heads // kv_heads
    if bias is None:
        bias = block_bias(causal_mask(w, span, q.device) if mask is None else mask)
    if w > CHUNK:
        parts = [
            block_attention(q[:, :, a : a + CHUNK], k, v, scale=scale, bias=bias[..., a : a + CHUNK, :])
            for a in range(0, w, CHUNK)
        ]
        return torch.cat(parts, dim=2)
    rows = n * kv_heads
    k, v = k.contiguous(), v.contiguous()
    grouped = q.reshape(rows, rep * w, d)  # (kv head, query head of its group, position)
    scores = torch.bmm(grouped, k.view(rows, span, d).transpose(1, 2))
    scores = torch.add(bias, scores.view(n, kv_heads, rep, w, span), alpha=scale)  # float32
    weights = torch.softmax(scores, dim=-1).to(v.dtype).view(rows, rep * w, span)
    return torch.bmm(weights, v.view(rows, span, d)).view(n, heads, w, d)


# The bias of the last HF forward's mask: every layer of a forward gets the same mask object,
# so it is built once per forward, not once per layer. Holding the mask keeps the identity
# test sound (a freed tensor's id could be reused).
_last_bias: list = []  # [(mask, (w, span, device), bias)], at most one


def _bias_for(attention_mask: torch.Tensor | None, w: int, span: int, device) -> torch.Tensor:
    shape = (w, span, str(device))
    if _last_bias and _last_bias[0][0] is attention_mask and _last_bias[0][1] == shape:
        return _last_bias[0][2]
    if attention_mask is None:
        bias = block_bias(causal_mask(w, span, device))
    elif attention_mask.dtype == torch.bool:
        bias = block_bias(attention_mask[:, :, -w:, -span:])
    else:  # an additive float mask
        bias = attention_mask[:, :, None, -w:, -span:].float()
    _last_bias[:] = [(attention_mask, shape, bias)]
    return bias


def hf_block_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """`block_attention` in the shape of a transformers attention function (CPU only; other
    devices, dropout, soft-capping and sliding windows take SDPA's function)."""
    plain = (
        query.device.type == "cpu"
        and not dropout
        and kwargs.get("softcap") is None
        and kwargs.get("sliding_window") is None
        and kwargs.get("position_bias") is None
    )
    if not plain:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    bias = _bias_for(attention_mask, query.shape[2], key.shape[2], query.device)
    out = block_attention(query, key, value, scale=scale, bias=bias)
    return out.transpose(1, 2).contiguous(), None


def use_block_attention(model) -> bool:
    """Have a CPU Hugging Face model's attention layers call `block_attention`; False (and
    nothing changed) when the model does not dispatch through transformers' attention
    interface or is not on a CPU."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = getattr(model, "config", None)
    if config is None or next(model.parameters()).device.type != "cpu":
        return False
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager", NAME):
        return False
    AttentionInterface.register(NAME, hf_block_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError, TypeError, KeyError):
        return False
    return getattr(model.config, "_attn_implementation", None) == NAME
