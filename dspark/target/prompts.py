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


def chat_prefix(tokenizer) -> list[int]:
    """The token ids every one-user-turn chat prompt starts with (the template's system turn
    and the user turn's header), for a prefix cache; empty without a chat template."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return []
    from dspark.target.slots import shared_prefix

    # Messages unlike each other in their first character, so no tokenizer merges them alike.
    return shared_prefix([encode_prompt(tokenizer, m) for m in ("a", "Z 1", "7 ?", "(x)")])
