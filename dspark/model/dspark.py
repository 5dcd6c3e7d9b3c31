"""The DSpark drafter: a DFlash block-parallel backbone plus a Markov and a confidence head.

Backbone (DFlash): Qwen3-style pre-norm decoder layers whose attention takes the
projected target features as extra keys/values (``K = k_norm(k_proj([ctx ; x]))``,
``V = v_proj([ctx ; x])``); queries come from the block tokens only and attend to the
whole context and, bidirectionally, to the whole block.

Heads (DSpark): ``logits_k = U_k + W2(W1[prev_k])`` and
``c_k = sigmoid(proj([h_k ; W1[prev_k]]))``.

Parameter names follow the speculators ``dspark`` checkpoint layout, so the state dict
maps onto that format one to one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dspark.model.config import DSparkConfig
from dspark.model.vocab import TargetTiedVocab


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, cast back to the input dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32).to(dtype)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 RoPE tables for absolute ``positions`` [N] (or [b, N]: a block per sequence) ->
    cos, sin [N, head_dim] (or [b, N, head_dim])."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [b, heads, N, d] by the tables [N, d] or [b, N, d] (HF rotate-half
    layout), in fp32."""
    if cos.dim() == 3:  # one table per sequence: broadcast over the heads
        cos, sin = cos[:, None], sin[:, None]
    dtype = x.dtype
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos + rotated * sin).to(dtype)


class DFlashAttention(nn.Module):
    """GQA attention whose keys/values are the context features followed by the block."""

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = d
        self.rope_theta = config.rope_theta
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.k_norm = RMSNorm(d, config.rms_norm_eps)

    def _kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rotary_cos_sin(positions, self.head_dim, self.rope_theta)
        return apply_rotary(k, cos, sin), v

    def context_kv(
        self,
        ctx: torch.Tensor,  # [b, T, H] projected target features
        positions: torch.Tensor,  # [T]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values of context tokens ([b, kv_heads, T, d] each); cacheable."""
        return self._kv(ctx, positions)

    def forward(
        self,
        x: torch.Tensor,  # [b, N, H] block tokens
        positions: torch.Tensor,  # [N]
        ctx_k: torch.Tensor,  # [b, kv_heads, T, d]
        ctx_v: torch.Tensor,  # [b, kv_heads, T, d]
        attn_mask: torch.Tensor | None = None,  # [N, T + N] bool, True = may attend
    ) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, self.num_heads, self.head_dim)).transpose(1, 2)
        cos, sin = rotary_cos_sin(positions, self.head_dim, self.rope_theta)
        q = apply_rotary(q, cos, sin)
        k_blk, v_blk = self._kv(x, positions)
        k = torch.cat([ctx_k.to(k_blk.dtype), k_blk], dim=2)
        v = torch.cat([ctx_v.to(v_blk.dtype), v_blk], dim=2)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, x, positions, ctx_k, ctx_v, attn_mask=None):
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v, attn_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    """Low-rank first-order logit bias ``W2(W1[prev])``; ``W1`` spans the target vocab."""

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        r = config.markov_rank
        self.head_type = config.markov_head_type
        self.rank = r
        self.markov_w1 = nn.Embedding(config.target_vocab_size, r)
        self.markov_w2 = nn.Linear(r, config.draft_vocab_size, bias=False)
        nn.init.normal_(self.markov_w1.weight, std=0.01)
        if self.head_type == "gated":
            self.gate_proj = nn.Linear(config.hidden_size + r, r)
        elif self.head_type == "rnn":
            self.joint_proj = nn.Linear(2 * r + config.hidden_size, 3 * r)

    def step(
        self,
        prev_emb: torch.Tensor,  # [..., r]  W1[prev]
        hidden: torch.Tensor,  # [..., H]  backbone hidden of this slot
        state: torch.Tensor | None,  # [..., r] rnn state (None = zeros / not used)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Bias for one slot ([..., V_d]) and the next rnn state."""
        if self.head_type == "vanilla":
            return self.markov_w2(prev_emb), None
        hidden = hidden.to(prev_emb.dtype)
        if self.head_type == "gated":
            gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, prev_emb], dim=-1)))
            return self.markov_w2(gate * prev_emb), None
        if state is None:
            state = torch.zeros_like(prev_emb)
        gate_raw, cand_raw, out_raw = self.joint_proj(torch.cat([state, prev_emb, hidden], dim=-1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate_raw)
        state = gate * state + (1.0 - gate) * torch.tanh(cand_raw)
        return self.markov_w2(torch.tanh(out_raw)), state

    def block_bias(
        self,
        prev_ids: torch.Tensor,  # [N, B] target ids of each slot's previous token
        hidden: torch.Tensor,  # [N, B, H]
    ) -> torch.Tensor:
        """Teacher-forced bias for whole blocks -> [N, B, V_d]."""
        prev_emb = self.markov_w1(prev_ids)
        if self.head_type != "rnn":
            return self.step(prev_emb, hidden, None)[0]
        state, outs = None, []
        for k in range(prev_ids.shape[1]):
            bias, state = self.step(prev_emb[:, k], hidden[:, k], state)
            outs.append(bias)
        return torch.stack(outs, dim=1)


class ConfidenceHead(nn.Module):
    """Per-slot acceptance-probability logit from ``[h_k ; W1[prev_k]]`` (or ``h_k``)."""

    def __init__(self, input_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_dim, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


class DSparkDraftModel(TargetTiedVocab, nn.Module):
    """DSpark drafter. Build with a `DSparkConfig`; weights via `dspark.formats.checkpoint`."""

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        m = len(config.aux_hidden_state_layer_ids)
        self.embed_tokens = nn.Embedding(config.target_vocab_size, h)
        self.fc = nn.Linear(m * config.target_hidden_size, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.markov_head = MarkovHead(config) if config.markov_rank > 0 else None
        self.confidence_head = None
        if config.enable_confidence_head:
            extra = config.markov_rank if config.confidence_head_with_markov else 0
            self.confidence_head = ConfidenceHead(h + extra)
        # Vocab mapping (DESIGN §4): target_id = draft_id + d2t[draft_id]; t2d marks kept ids.
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        t2d = torch.zeros(config.target_vocab_size, dtype=torch.bool)
        t2d[: config.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)
        # The target's embedding and lm_head rows are frozen copies.
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)
        self._init_weights()

    def _init_weights(self) -> None:
        std = 1.0 / math.sqrt(self.config.hidden_size)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and not name.startswith(("lm_head", "markov_head")):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ inference pieces
    def project_context(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """Target features [..., T, m·H_t] -> drafter context [..., T, H] (fc + hidden_norm)."""
        return self.hidden_norm(self.fc(aux_hidden.to(self.fc.weight.dtype)))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer context keys/values for projected context ``ctx`` [b, T, H]."""
        return [layer.self_attn.context_kv(ctx, positions) for layer in self.layers]

    def backbone(
        self,
        block_ids: torch.Tensor,  # [b, N] target ids (anchor + mask tokens per block)
        positions: torch.Tensor,  # [N], or [b, N] when each row has its own anchor position
        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]],
        attn_mask: torch.Tensor | None = None,  # [N, T + N] (or [b, 1, N, T + N]) bool
    ) -> torch.Tensor:
        """Final-normed backbone hidden states of the block slots, [b, N, H]."""
        x = self.embed_tokens(block_ids).to(self.fc.weight.dtype)
        for layer, (k, v) in zip(self.layers, ctx_kv, strict=True):
            x = layer(x, positions, k, v, attn_mask)
        return self.norm(x)

    def block_input_ids(self, anchor: torch.Tensor) -> torch.Tensor:
        """[b] anchor ids -> [b, B] block input: the anchor then B-1 mask tokens."""
        block = anchor.new_full((anchor.shape[0], self.config.block_size), self.config.mask_token_id)
        block[:, 0] = anchor
        return block

    def confidence_logit(self, hidden: torch.Tensor, prev_emb: torch.Tensor | None) -> torch.Tensor:
        assert self.confidence_head is not None
        if self.config.confidence_head_with_markov:
            assert prev_emb is not None
            hidden = torch.cat([hidden, prev_emb.to(hidden.dtype)], dim=-1)
        return self.confidence_head(hidden.to(self.confidence_head.proj.weight.dtype)).float()

    def prev_embedding(self, prev_ids: torch.Tensor) -> torch.Tensor | None:
        return None if self.markov_head is None else self.markov_head.markov_w1(prev_ids)
