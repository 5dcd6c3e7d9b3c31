"""Self-distillation data: the target regenerates the responses to training prompts.

Each output row holds the prompt (chat template applied when the tokenizer has one) and
the target's own response, tokenized, with ``loss_mask`` True on the response tokens.
Rows are appended to a JSONL file keyed by prompt index, so an interrupted run resumes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

from dspark.errors import DSparkError


def read_prompts(path: str | Path, field: str | None = None) -> list:
    """Prompts from JSONL: a ``messages`` list (chat), or a text field (``prompt``, ``question``, ...)."""
    src = Path(path)
    if not src.is_file():
        raise DSparkError(f"{src}: prompt file not found")
    prompts = []
    for n, line in enumerate(src.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DSparkError(f"{src}:{n}: not JSON ({exc})") from None
        if field is not None:
            if field not in row:
                raise DSparkError(f"{src}:{n}: no field {field!r}")
            prompts.append(row[field])
            continue
        for key in ("messages", "prompt", "question", "problem", "turns", "text"):
            if key in row:
                value = row[key]
                prompts.append(value[0] if key == "turns" and isinstance(value, list) else value)
                break
        else:
            raise DSparkError(f"{src}:{n}: no prompt field (messages, prompt, question, problem, turns, text)")
    return prompts


def encode_prompt(tokenizer, prompt) -> list[int]:
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    text = "\n".join(m["content"] for m in messages)
    return list(tokenizer(text)["input_ids"])


@torch.inference_mode()
def self_distill(
    target,
    prompts: list,
    out_path: str | Path,
    *,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = True,
) -> int:
    """Append one row per prompt not yet in ``out_path``; returns how many rows were written."""
    from tqdm import tqdm

    out = Path(out_path)
    done = set()
    if out.is_file():
        text = out.read_bytes()
        if text and not text.endswith(b"\n"):
            # A kill mid-write left half a row; appending after it would glue the next row on.
            text = text[: text.rfind(b"\n") + 1]
            with out.open("rb+") as fh:
                fh.truncate(len(text))
        for line in text.decode().splitlines():
            if line.strip():
                try:
                    done.add(json.loads(line)["id"])
                except (json.JSONDecodeError, KeyError):
                    continue  # not a row of ours; its prompt (if any) is regenerated
    todo = [i for i in range(len(prompts)) if i not in done]
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    stops = target.stop_token_ids()
    written = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(prompts), initial=len(done), desc="datagen", disable=not progress, unit="prompt")
    with out.open("a") as fh:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            encoded = [encode_prompt(tok, prompts[i]) for i in chunk]
            for i, e in zip(chunk, encoded, strict=True):
                if not e:
                    raise DSparkError(f"prompt {i} encodes to zero tokens")
            width = max(len(e) for e in encoded)
            ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])
            attn = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
            torch.manual_seed(seed + chunk[0])
            gen = target.model.generate(
                input_ids=ids.to(target.device),
                attention_mask=attn.to(target.device),
                max_new_tokens=max_new_tokens,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_p=top_p if temperature > 0 else None,
                pad_token_id=pad,
                eos_token_id=sorted(stops) or None,
            )
            for row, i, prompt_ids in zip(gen[:, width:].tolist(), chunk, encoded, strict=True):
                response = _cut(row, stops, pad)
                fh.write(
                    json.dumps(
                        {
                            "id": i,
                            "input_ids": prompt_ids + response,
                            "loss_mask": [0] * len(prompt_ids) + [1] * len(response),
                        }
                    )
                    + "\n"
                )
                written += 1
            fh.flush()
            bar.update(len(chunk))
    bar.close()
    return written


def _cut(tokens: Iterable[int], stops: set[int], pad: int) -> list[int]:
    out = []
    for t in tokens:
        out.append(t)
        if t in stops:
            break
    while out and out[-1] == pad and pad not in stops:
        out.pop()
    return out
