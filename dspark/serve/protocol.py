"""OpenAI request bodies, validated: fields the OpenAI API does not have are errors; fields
it has that we do not implement are accepted only at their no-op values.

(``top_k`` is accepted as vLLM accepts it, as an extension.)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOP = 4


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    n: int = 1
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: Any = None
    user: str | None = None
    # vLLM's extension: the choice carries the generated `token_ids` and the `prompt_token_ids`
    # (what `dspark datagen --server` asks for, so text is never re-tokenized).
    return_token_ids: bool = False

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if isinstance(v, list):
            if len(v) > MAX_STOP:
                raise ValueError(f"at most {MAX_STOP} stop sequences")
            if not all(isinstance(s, str) and s for s in v):
                raise ValueError("stop sequences must be non-empty strings")
        elif isinstance(v, str) and not v:
            raise ValueError("stop must not be an empty string")
        return v

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v):
        if v is not None and set(v) - {"include_usage", "continuous_usage_stats"}:
            raise ValueError(f"unknown stream_options {sorted(set(v) - {'include_usage', 'continuous_usage_stats'})}")
        return v

    @model_validator(mode="after")
    def _unsupported(self):
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty and frequency_penalty are not supported (they must be 0)")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported")
        if self.logprobs not in (None, False, 0):
            raise ValueError("logprobs are not supported")
        if self.stream_options and not self.stream:
            raise ValueError("stream_options needs stream=true")
        if self.return_token_ids and self.stream:
            raise ValueError("return_token_ids is supported without stream only")
        return self

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be empty")
            if isinstance(v[0], str | list):
                if len(v) != 1:
                    raise ValueError("one prompt per request (batched prompts are not supported)")
                v = v[0]
        if isinstance(v, str) and not v:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        return v

    @model_validator(mode="after")
    def _completion_only(self):
        if self.echo:
            raise ValueError("echo is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of not in (None, 1):
            raise ValueError("best_of is not supported")
        return self


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]]
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, v):
        if isinstance(v, list):
            parts = []
            for part in v:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError("only text content parts are supported")
                parts.append(part["text"])
            return "".join(parts)
        return v


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    top_logprobs: int | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    @model_validator(mode="after")
    def _chat_only(self):
        if self.tools:
            raise ValueError("tools are not supported")
        if self.response_format not in (None, {"type": "text"}):
            raise ValueError("response_format other than text is not supported")
        if self.top_logprobs:
            raise ValueError("logprobs are not supported")
        return self

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
