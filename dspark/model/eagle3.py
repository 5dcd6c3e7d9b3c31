"""The EAGLE-3 drafter, a peer to compare DSpark with (speculators ``eagle3`` layout).

One Llama-style decoder layer whose input at position t joins the token embedding with
a hidden vector: ``x = [input_layernorm(embed(token)) ; hidden_norm(hidden)]`` (2H wide;
q/k/v project from 2H, the residual stream is ``hidden``). For the first draft of a step
``hidden`` is the fused target feature ``fc([low ; mid ; high])`` of the position before
the token; each later draft feeds back the layer output of the draft before it (a chain,
one layer forward per drafted token). Logits: ``lm_head(norm(out))`` over the same pruned
draft vocab as DSpark (``d2t``/``t2d``); ``embed_tokens`` and ``lm_head`` are frozen
copies of the target's.

Positions follow speculators: the pair (feature of t-1, token t) sits at position t.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dspark.errors import ConfigError
from dspark.model.config import LAYER_ID_CONVENTION, DSparkConfig
from dspark.model.dspark import RMSNorm, SwiGLU, apply_rotary, rotary_cos_sin
from dspark.model.vocab import TargetTiedVocab


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab_size: int
    target_vocab_size: int
    target_hidden_size: int
    aux_hidden_state_layer_ids: tuple[int, ...]
    num_target_layers: int
    speculative_steps: int = 7  # chain length it is trained for (training-time test depth)
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    num_hidden_layers: int = 1
    aux_layer_id_convention: str = LAYER_ID_CONVENTION
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    method = "eagle3"

    def __post_init__(self) -> None:
        object.__setattr__(self, "aux_hidden_state_layer_ids", tuple(int(i) for i in self.aux_hidden_state_layer_ids))
        if self.num_hidden_layers != 1:
            raise ConfigError(f"eagle3: one decoder layer is supported, got num_hidden_layers={self.num_hidden_layers}")
        for name in (
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "draft_vocab_size",
            "target_vocab_size",
            "target_hidden_size",
            "num_target_layers",
            "speculative_steps",
        ):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"eagle3: {name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("eagle3: num_attention_heads must be a multiple of num_key_value_heads")
        if self.draft_vocab_size > self.target_vocab_size:
            raise ConfigError("eagle3: draft_vocab_size exceeds target_vocab_size")
        if not self.aux_hidden_state_layer_ids:
            raise ConfigError("eagle3: aux_hidden_state_layer_ids is empty")

    @property
    def drafts_per_block(self) -> int:
        return self.speculative_steps

    @property
    def uses_pruned_vocab(self) -> bool:
        return self.draft_vocab_size != self.target_vocab_size

    @classmethod
    def like(cls, config: DSparkConfig, *, speculative_steps: int = 7) -> Eagle3Config:
        """The EAGLE-3 config with the same sizes, features and vocab as a DSpark config."""
        shared = {f.name for f in dataclasses.fields(cls)} - {"speculative_steps", "num_hidden_layers"}
        return cls(**{k: getattr(config, k) for k in shared}, speculative_steps=speculative_steps)

    def replace(self, **changes: Any) -> Eagle3Config:
        return dataclasses.replace(self, **changes)


class Eagle3Attention(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.rope_theta = config.rope_theta
        self.q_proj = nn.Linear(2 * h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x [n, 2H], positions [n] -> q [heads, n, d], k/v [kv_heads, n, d] (RoPE applied)."""
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim).transpose(0, 1)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim).transpose(0, 1)
        cos, sin = rotary_cos_sin(positions, self.head_dim, self.rope_theta)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def expand(self, kv: torch.Tensor) -> torch.Tensor:
        groups = self.num_heads // self.num_kv_heads
        return kv.repeat_interleave(groups, dim=0) if groups > 1 else kv


class Eagle3Layer(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        h = config.hidden_size
        self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.self_attn = Eagle3Attention(config)
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.mlp = SwiGLU(h, config.intermediate_size)

    def attn_input(self, emb: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attn [heads, n, d] (attention output before o_proj) -> layer output [n, H]."""
        x = residual + self.self_attn.o_proj(attn.transpose(0, 1).reshape(attn.shape[1], -1))
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3DraftModel(TargetTiedVocab, nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.embed_tokens = nn.Embedding(config.target_vocab_size, h)
        self.fc = nn.Linear(len(config.aux_hidden_state_layer_ids) * config.target_hidden_size, h, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(config)])
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        t2d = torch.zeros(config.target_vocab_size, dtype=torch.bool)
        t2d[: config.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)
        std = 1.0 / math.sqrt(h)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and not name.startswith("lm_head"):
                nn.init.normal_(module.weight, std=std)

    confidence_head = None
    markov_head = None

    @property
    def layer(self) -> Eagle3Layer:
        return self.layers[0]

    def project(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """Target features [n, m·H_t] -> first-draft hidden input [n, H]."""
        return self.fc(aux_hidden.to(self.fc.weight.dtype))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids).to(self.fc.weight.dtype)

    def attend(self, q, keys, values, mask=None) -> torch.Tensor:
        """q [heads, n, d]; keys/values [kv_heads, L, d]; mask [n, L] bool (True = attend)."""
        attn = self.layer.self_attn
        return F.scaled_dot_product_attention(
            q[None],
            attn.expand(keys)[None],
            attn.expand(values)[None],
            attn_mask=None if mask is None else mask[None, None],
        )[0]

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.base_logits(self.norm(out))


def train_forward(
    model: Eagle3DraftModel,
    aux_hidden: torch.Tensor,  # [T, m·H_t]
    input_ids: torch.Tensor,  # [T]
    document_ids: torch.Tensor,  # [T]
    anchors: torch.Tensor,  # [N] positions p >= 1 of the bonus token that opens each chain
    prev_ids: torch.Tensor,  # [N, D] teacher-forced input token of draft k (the token at p+k)
) -> torch.Tensor:
    """Training-time test: draft logits [N, D, V_d] of chains unrolled on their own hidden
    states (tokens teacher-forced, as in EAGLE-3 / speculators).

    Chain c = p - 1: step 0 pairs feature c with token p; step j feeds the layer output of
    step j-1 with token p+j at position p+j. A step attends to every real pair up to c in
    its document and to its own chain's earlier steps — exactly what it sees when drafting.
    """
    layer, attn = model.layer, model.layer.self_attn
    device = model.fc.weight.device
    t = input_ids.shape[0]
    ids, docs = input_ids.to(device), document_ids.to(device)
    anchors = anchors.to(device)
    # Real pairs (feature i, token i+1) at positions i+1, i = 0..T-2.
    hidden0 = model.project(aux_hidden[: t - 1].to(device))
    x0 = layer.attn_input(model.embed(ids[1:]), hidden0)
    _, k0, v0 = attn.qkv(x0, torch.arange(1, t, device=device))
    chain = anchors - 1  # [N] pair index of each chain's first step
    ctx_mask = (torch.arange(t - 1, device=device)[None, :] <= chain[:, None]) & (
        docs[: t - 1][None, :] == docs[anchors][:, None]
    )  # [N, T-1]
    hidden = hidden0[chain]
    steps = prev_ids.shape[1]
    own_k, own_v, out = [], [], []
    for j in range(steps):
        x = layer.attn_input(model.embed(prev_ids[:, j].to(device)), hidden)
        q, k, v = attn.qkv(x, anchors + j)
        if j > 0:
            own_k.append(k)
            own_v.append(v)
        # Scores against the real pairs (masked) and the chain's own steps 1..j (one key each).
        kq, vq = attn.expand(k0), attn.expand(v0)
        s_ctx = torch.einsum("hnd,hld->hnl", q.float(), kq.float()) / math.sqrt(attn.head_dim)
        s_ctx = s_ctx.masked_fill(~ctx_mask[None], float("-inf"))
        parts, vals = [s_ctx], None
        if own_k:
            ok = attn.expand(torch.stack(own_k, dim=2))  # [heads, N, j, d]
            ov = attn.expand(torch.stack(own_v, dim=2))
            parts.append(torch.einsum("hnd,hnjd->hnj", q.float(), ok.float()) / math.sqrt(attn.head_dim))
            vals = ov
        w = torch.softmax(torch.cat(parts, dim=-1), dim=-1)
        o = torch.einsum("hnl,hld->hnd", w[..., : t - 1], vq.float())
        if vals is not None:
            o = o + torch.einsum("hnj,hnjd->hnd", w[..., t - 1 :], vals.float())
        hidden = layer.finish(o.to(x.dtype), hidden)
        out.append(hidden)
    return model.logits(torch.stack(out, dim=1))  # [N, D, V_d]
