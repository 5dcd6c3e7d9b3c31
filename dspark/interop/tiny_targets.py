"""Tiny random Hugging Face targets (Llama, Qwen3, DeepSeek-V3) with a real tokenizer, built offline:
the targets of the test suite and of the interop checks' tiny drafter variants."""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The answer is 42. #### 42",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "for i in range(10):\n    print(i * i)\n",
    "Speculative decoding drafts several tokens and the target verifies them in one pass.",
] * 20

SPECIALS = ["<pad>", "<eos>", "<mask>", "<unk>"]


def build_tokenizer(vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", mask_token="<mask>", unk_token="<unk>"
    )


def tiny_config(arch: str, vocab_size: int):
    from transformers import DeepseekV3Config, LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        max_position_embeddings=512,
        initializer_range=0.1,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    if arch == "llama":
        return LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **common)
    if arch == "qwen3":
        return Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=16, **common)
    if arch == "deepseek_v3":
        return DeepseekV3Config(
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=None,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            **common,
        )
    raise ValueError(arch)


def build_tiny_target(directory: Path, arch: str = "qwen3", seed: int = 0, hidden_size: int | None = None) -> Path:
    """Write a tiny random causal LM + tokenizer as a normal HF directory (``hidden_size``: a
    wider one with the same tokenizer, which no drafter of the 64-wide targets fits)."""
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer()
    config = tiny_config(arch, vocab_size=len(tokenizer))
    if hidden_size is not None:
        config.hidden_size, config.intermediate_size = hidden_size, 2 * hidden_size
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


SIMPLE_CHAT_TEMPLATE = (
    "{% for m in messages %}<eos>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<mask>{% endif %}"
)


def with_chat_template(src: Path, dst: Path, template: str = SIMPLE_CHAT_TEMPLATE) -> Path:
    """A copy of a tiny target directory whose tokenizer has ``template`` as its chat template."""
    import json
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst
