"""How a prompt becomes token ids, for every path (generate, serve, bench, datagen, corpus):
the chat template when the tokenizer has one and the prompt is a chat turn, else the plain
text with the tokenizer's special tokens."""

from __future__ import annotations

from dspark.errors import DSparkError


def encode_prompt(tokenizer, prompt, *, chat: bool = True) -> list[int]:
    """``prompt``: a user message (str) or a ``messages`` list. ``chat=False`` encodes a str
    as plain text even when the tokenizer has a chat template."""
    if tokenizer is None:
        raise DSparkError("the target has no tokenizer; cannot encode a prompt")
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    if getattr(tokenizer, "chat_template", None) and (chat or isinstance(prompt, list)):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    text = "\n".join(m["content"] for m in messages)
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def user_turn_prefix(tokenizer) -> list[int]:
    """The chat template's tokens up to where a one-turn user message starts (its system turn
    and the user turn's header); empty without a chat template."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return []
    with_marker = encode_prompt(tokenizer, "\u2063MAGPIE\u2063")
    plain = encode_prompt(tokenizer, "")
    n = 0
    while n < min(len(with_marker), len(plain)) and with_marker[n] == plain[n]:
        n += 1
    return with_marker[:n]


def chat_prefix(tokenizer, minimum: int = 4) -> list[int]:
    """`user_turn_prefix` as a prefix cache's key: empty when shorter than ``minimum`` tokens
    (caching it would save nothing)."""
    head = user_turn_prefix(tokenizer)
    return head if len(head) >= minimum else []
