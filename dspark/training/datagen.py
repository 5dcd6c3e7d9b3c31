"""Self-distillation data: the target regenerates the responses to training prompts.

Each output row holds the prompt (chat template applied when the tokenizer has one) and
the target's own response, tokenized, with ``loss_mask`` True on the response tokens.
Rows are appended to a JSONL file keyed by prompt index, so an interrupted run resumes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from dspark.errors import DSparkError
from dspark.target.prompts import encode_prompt


def read_prompts(path: str | Path, field: str | None = None) -> list:
    """Prompts from JSONL: a ``messages`` list (chat), or a text field (``prompt``, ``question``, ...)."""
    src = Path(path)
    if not src.is_file():
        raise DSparkError(f"{src}: prompt file not found")
    prompts = []
    for n, line in enumerate(src.read_text().split("\n"), 1):
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


class GenerateEngine:
    """Hugging Face ``generate`` over static batches of ``batch_size`` prompts (left-padded;
    a batch runs until its longest answer ends). Works for every target."""

    kind = "generate"

    def __init__(
        self,
        target,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        batch_size: int = 8,
    ) -> None:
        self.target, self.batch_size = target, batch_size
        self.max_new_tokens, self.temperature, self.top_p, self.seed = max_new_tokens, temperature, top_p, seed

    @property
    def name(self) -> str:
        name = f"dspark-{self.kind}/{str(self.target.dtype).removeprefix('torch.')}"
        device = torch.device(self.target.device).type
        return name if device == "cpu" else f"{name}/{device}"  # greedy ties may break otherwise there

    @torch.inference_mode()
    def run(self, prompts: list[list[int]]) -> Iterator[tuple[int, list[int]]]:
        """``(index, response ids)`` per prompt, stop token included."""
        tok, target = self.target.tokenizer, self.target
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        stops = target.stop_token_ids()
        for start in range(0, len(prompts), self.batch_size):
            encoded = prompts[start : start + self.batch_size]
            width = max(len(e) for e in encoded)
            ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])
            attn = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
            torch.manual_seed(self.seed + start)
            sampling = self.temperature > 0
            gen = target.model.generate(
                input_ids=ids.to(target.device),
                attention_mask=attn.to(target.device),
                max_new_tokens=self.max_new_tokens,
                do_sample=sampling,
                temperature=self.temperature if sampling else None,
                top_p=self.top_p if sampling else None,
                pad_token_id=pad,
                eos_token_id=sorted(stops) or None,
            )
            for offset, row in enumerate(gen[:, width:].tolist()):
                yield start + offset, _cut(row, stops, pad)


class SlotEngine(GenerateEngine):
    """Continuous batching over a slot KV cache (`dspark.target.slots`): ``slots`` sequences
    decode together, a finished one is replaced by the next prompt at once. Llama-style
    targets only (`make_engine` falls back to `GenerateEngine` for others)."""

    kind = "slots"

    def __init__(self, target, *, slots: int = 64, max_prompt_len: int = 1024, **kwargs) -> None:
        from dspark.target.slots import SlotDecoder

        super().__init__(target, **kwargs)
        self.max_prompt_len = max_prompt_len
        self.decoder = SlotDecoder(target.model, slots=slots, max_len=max_prompt_len + self.max_new_tokens + 1)
        self.decoder.check()

    def run(self, prompts: list[list[int]]) -> Iterator[tuple[int, list[int]]]:
        from dspark.target.slots import continuous_generate

        return continuous_generate(
            self.decoder,
            prompts,
            max_new_tokens=self.max_new_tokens,
            stop_ids=self.target.stop_token_ids(),
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
        )


class ServerEngine:
    """An OpenAI-compatible server answers (vLLM, `dspark serve`, any that takes a prompt of
    token ids on ``/v1/completions`` and returns vLLM's ``token_ids`` with ``return_token_ids``):
    ``concurrency`` requests in flight, prompts sent as token ids and answers received as token
    ids, so nothing is re-tokenized. Answers come back in completion order."""

    kind = "server"

    def __init__(
        self,
        url: str,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        concurrency: int = 16,
        model: str | None = None,
        stop_ids: set[int] | None = None,
        timeout: float = 600.0,
    ) -> None:
        from dspark.training.server_client import ServerClient

        self.client = ServerClient(url, timeout=timeout)
        self.url = self.client.url
        self.max_new_tokens, self.temperature, self.top_p, self.seed = max_new_tokens, temperature, top_p, seed
        self.concurrency, self.stop_ids = concurrency, set(stop_ids or ())
        self.model = model or self.client.served_model("; pass --model")

    @property
    def name(self) -> str:
        return f"server/{self.model}"

    def answer(self, index: int, prompt: list[int]) -> list[int]:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed + index,
            "return_token_ids": True,
        }
        choice = (self.client.post("/v1/completions", body).get("choices") or [{}])[0]
        ids = choice.get("token_ids")
        if not isinstance(ids, list):
            raise DSparkError(
                f"{self.url}: the completion carries no token_ids; the server must support vLLM's return_token_ids"
            )
        return [int(t) for t in ids]

    def run(self, prompts: list[list[int]]) -> Iterator[tuple[int, list[int]]]:
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
        from itertools import islice

        todo = iter(enumerate(prompts))
        with ThreadPoolExecutor(self.concurrency) as pool:
            running = {pool.submit(self.answer, i, p): i for i, p in islice(todo, self.concurrency)}
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    index = running.pop(fut)
                    yield index, fut.result()
                    for i, p in islice(todo, 1):
                        running[pool.submit(self.answer, i, p)] = i


ENGINES = ("auto", "slots", "generate")


def make_engine(
    kind: str, target, *, slots: int = 64, batch_size: int = 8, max_prompt_len: int = 1024, log=None, **kwargs
) -> GenerateEngine:
    """``auto``: continuous batching where the target's architecture allows, else ``generate``."""
    from dspark.target.slots import SlotDecoderUnsupportedError

    if kind not in ENGINES:
        raise DSparkError(f"--engine {kind!r}: choose one of {', '.join(ENGINES)}")
    if kind == "generate":
        return GenerateEngine(target, batch_size=batch_size, **kwargs)
    try:
        return SlotEngine(target, slots=slots, max_prompt_len=max_prompt_len, **kwargs)
    except SlotDecoderUnsupportedError as exc:
        if kind == "slots":
            raise
        if log:
            log(f"note: {exc}; using generate")
        return GenerateEngine(target, batch_size=batch_size, **kwargs)


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
    engine: GenerateEngine | ServerEngine | None = None,
    tokenizer=None,
) -> int:
    """Append one row per prompt not yet in ``out_path``; returns how many rows were written.
    ``engine`` (default: `GenerateEngine` with ``batch_size``) generates; its name is recorded
    in every row."""
    from tqdm import tqdm

    out = Path(out_path)
    done = {row["id"] for row in read_rows_resumable(out) if "id" in row}
    todo = [i for i in range(len(prompts)) if i not in done]
    tok = tokenizer if tokenizer is not None else target.tokenizer
    engine = engine or GenerateEngine(
        target, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, batch_size=batch_size
    )
    encoded = [encode_prompt(tok, prompts[i]) for i in todo]
    for i, e in zip(todo, encoded, strict=True):
        if not e:
            raise DSparkError(f"prompt {i} encodes to zero tokens")
    written = tokens = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(prompts), initial=len(done), desc="datagen", disable=not progress, unit="prompt")
    with out.open("a") as fh:
        for k, response in engine.run(encoded):
            prompt_ids = encoded[k]
            row = {
                "id": todo[k],
                "input_ids": prompt_ids + response,
                "loss_mask": [0] * len(prompt_ids) + [1] * len(response),
                "engine": engine.name,
            }
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            written += 1
            tokens += len(response)
            bar.update(1)
            bar.set_postfix_str(f"{tokens / max(bar.format_dict['elapsed'], 1e-9):.0f} tok/s", refresh=False)
    bar.close()
    return written


def read_rows_resumable(path: Path) -> list[dict]:
    """The JSON rows of an append-only file; a row a kill cut half-way is truncated away (so
    the next append does not glue onto it), lines that are not rows of ours are skipped."""
    if not path.is_file():
        return []
    text = path.read_bytes()
    if text and not text.endswith(b"\n"):
        text = text[: text.rfind(b"\n") + 1]
        with path.open("rb+") as fh:
            fh.truncate(len(text))
    rows = []
    for line in text.decode().split("\n"):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _cut(tokens: Iterable[int], stops: set[int], pad: int) -> list[int]:
    out = []
    for t in tokens:
        out.append(t)
        if t in stops:
            break
    while out and out[-1] == pad and pad not in stops:
        out.pop()
    return out
