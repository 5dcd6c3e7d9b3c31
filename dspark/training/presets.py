"""Named recipes: a drafter architecture plus its training schedule.

``kimi-k2.7-code`` is the model card's drafter (3 layers, hidden 7168, 56/8 heads,
head_dim 128, FFN 18432, block 8, draft vocab 32000 of 163840, Markov rank 256 vanilla,
confidence head with Markov, mask 163608, aux layers [1, 29, 57], seq 20000,
lr 3e-4 cosine, warmup 300, global batch 8 with accumulation 2, 0.1 CE + 0.9 TV,
gamma 4.0, max_anchors 3072, apply_verifier_norm false).
"""

from __future__ import annotations

from dspark.errors import ConfigError
from dspark.model.config import DSparkConfig

PRESETS: dict[str, dict] = {
    "kimi-k2.7-code": {
        "drafter": dict(
            num_hidden_layers=3,
            hidden_size=7168,
            num_attention_heads=56,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=18432,
            rope_theta=50000.0,
            block_size=8,
            draft_vocab_size=32000,
            target_vocab_size=163840,
            target_hidden_size=7168,
            markov_rank=256,
            markov_head_type="vanilla",
            enable_confidence_head=True,
            confidence_head_with_markov=True,
            mask_token_id=163608,
            aux_hidden_state_layer_ids=(1, 29, 57),
            num_target_layers=61,
            sample_from_anchor=True,
            apply_verifier_norm=False,
            max_position_embeddings=20000,
        ),
        # Global batch 8 = world size x grad_accum (2) x 1 sequence; on 4 ranks.
        "train": dict(
            steps=20000,
            lr=3e-4,
            warmup=300,
            grad_accum=2,
            seq_len=20000,
            ce_weight=0.1,
            tv_weight=0.9,
            decay_gamma=4.0,
            max_anchors=3072,
            autocast_bf16=True,
        ),
    },
}


def preset(name: str) -> dict:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; available: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def preset_config(name: str) -> DSparkConfig:
    return DSparkConfig(**preset(name)["drafter"])
