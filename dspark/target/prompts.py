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
