"""The HTTP side: an OpenAI-compatible API over the `Worker`.

``/v1/completions``, ``/v1/chat/completions`` (JSON or SSE streaming), ``/v1/models``,
``/health``, ``/metrics``. Errors follow OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``): 400 for a malformed or invalid
request, 429 when the queue is full, 503 while shutting down, 504 when a request waited past
its time-out. Every response carries the request's speculative-decoding figures in an extra
``spec_decode`` object (OpenAI clients expose it as ``response.model_extra``).

The module reads top down: a request becomes a `Job` (`read_body`, `parse_request`,
`make_job`, `submit`); the worker's events (`dspark.serve.worker.Event`) become one JSON
answer (`complete`) or an SSE stream (`stream`); `create_app` only wires the routes.

(No ``from __future__ import annotations`` here: FastAPI must resolve the ``Request``
annotations of the route handlers at runtime.)
"""

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from dspark.decoding.sampling import SamplingParams
from dspark.serve.metrics import Metrics
from dspark.serve.protocol import ChatCompletionRequest, CompletionRequest
from dspark.serve.worker import Failed, Finished, Job, QueueFullError, ShuttingDownError, Tokens, Worker
from dspark.target.prompts import encode_prompt


@dataclass
class ServerConfig:
    model_name: str
    max_model_len: int
    request_timeout: float
    speculative: bool
    num_speculative_tokens: int
    vocab_size: int
    default_max_tokens: int = 256
    dtype: str = "float32"  # the loaded target's compute dtype
    batch: int = 1  # requests decoded together (continuous batching); 1: one at a time


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


def _validation_message(exc) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(x) for x in err.get("loc", ()) if x not in ("body",))
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field (the OpenAI API has no such parameter)"
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def spec_decode_summary(result, k: int) -> dict[str, Any]:
    accepted = sum(result.position_accepts)
    summary = {
        "num_speculative_tokens": k,
        "accept_len": result.accept_len,
        "target_forwards": result.target_forwards,
        "draft_tokens": result.drafted_tokens,
        "accepted_tokens": accepted,
        "per_position_acceptance": result.per_position_acceptance,
        "decode_tokens_per_second": result.tokens_per_second,
    }
    if result.lookup_steps is not None:  # served with --prompt-lookup
        summary["lookup_steps"] = result.lookup_steps
    return summary


# ---------------------------------------------------------------------- request -> job
async def read_body(request) -> dict:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"malformed JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    return body


def parse_request(model_cls, body: dict, config: ServerConfig):
    from pydantic import ValidationError

    try:
        req = model_cls.model_validate(body)
    except ValidationError as exc:
        raise APIError(400, _validation_message(exc)) from None
    if req.model not in (None, config.model_name):
        raise APIError(
            404,
            f"model {req.model!r} does not exist; this server serves {config.model_name!r}",
            kind="not_found_error",
            param="model",
        )
    return req


def make_job(req, prompt_ids: list[int], max_tokens: int | None, config: ServerConfig) -> Job:
    """A job for the worker, its prompt and token budget checked against the context length."""
    if not prompt_ids:
        raise APIError(400, "the prompt encodes to zero tokens", param="prompt")
    if any(not isinstance(t, int) or not 0 <= t < config.vocab_size for t in prompt_ids):
        raise APIError(400, f"prompt token ids must lie in [0, {config.vocab_size})", param="prompt")
    budget = max_tokens if max_tokens is not None else config.default_max_tokens
    room = config.max_model_len - len(prompt_ids)
    if room < 1:
        raise APIError(
            400,
            f"the prompt has {len(prompt_ids)} tokens; this model's context is {config.max_model_len} tokens",
            param="prompt",
        )
    if max_tokens is not None and budget > room:
        raise APIError(
            400,
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({budget}) exceeds the context length "
            f"{config.max_model_len}",
            param="max_tokens",
        )
    return Job(
        prompt_ids=prompt_ids,
        max_tokens=min(budget, room),
        params=SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p),
        seed=req.seed,
        stop=req.stop_list,
        speculative=config.speculative,
        loop=asyncio.get_running_loop(),
        events=asyncio.Queue(),
        deadline=time.monotonic() + config.request_timeout,
    )


def submit(worker: Worker, job: Job) -> None:
    try:
        worker.submit(job)
    except QueueFullError:
        raise APIError(429, "the server is at its request bound; retry later", kind="rate_limit_error") from None
    except ShuttingDownError:
        raise APIError(503, "the server is shutting down", kind="service_unavailable") from None


# ---------------------------------------------------------------------- worker events -> client
@dataclass(frozen=True)
class ClientGone:
    """The client disconnected (the job is cancelled)."""


@dataclass(frozen=True)
class WaitedTooLong:
    """The job never started before its deadline (it is cancelled while still queued)."""


async def next_event(job: Job, request):
    """The next worker event (`Tokens`, `Finished`, `Failed`), or `ClientGone` / `WaitedTooLong`."""
    while True:
        try:
            return await asyncio.wait_for(job.events.get(), timeout=0.25)
        except TimeoutError:
            if await request.is_disconnected():
                job.cancelled.set()
                return ClientGone()
            if time.monotonic() > job.deadline + 1.0 and not job.cancelled.is_set():
                job.cancelled.set()  # still queued: the worker will skip it
                return WaitedTooLong()


@dataclass
class Reply:
    """What every answer to one request shares: its id, kind, timestamp and the server's name."""

    req: Any
    job: Job
    chat: bool
    config: ServerConfig
    k: int  # the server's draft length (0: plain decoding)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    def envelope(self, obj: str, choices: list, **extra) -> dict:
        head = {"id": self.id, "object": obj, "created": self.created, "model": self.config.model_name}
        return {**head, "choices": choices, **extra}

    def usage(self, result) -> dict:
        prompt, n = len(self.job.prompt_ids), len(result.tokens) if result else 0
        return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}

    def spec_decode(self, done: Finished) -> dict:
        return {**spec_decode_summary(done.result, self.k), "finish_detail": done.reason}


async def complete(reply: Reply, request):
    """The whole answer as one JSON object, once the worker has finished."""
    from fastapi.responses import JSONResponse

    text = []
    while True:
        event = await next_event(reply.job, request)
        if isinstance(event, Tokens):
            text.append(event.text)
        elif isinstance(event, Finished):
            break
        elif isinstance(event, Failed):
            raise APIError(500, event.message, kind="server_error")
        elif isinstance(event, WaitedTooLong):
            raise APIError(504, f"the request waited longer than {reply.config.request_timeout:.0f} s", kind="timeout")
        else:  # client gone: nobody to answer
            return JSONResponse({}, status_code=499)
    result = event.result
    choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(event.reason), "logprobs": None}
    if reply.chat:
        choice["message"] = {"role": "assistant", "content": "".join(text)}
    else:
        choice["text"] = "".join(text)
    if reply.req.return_token_ids:
        choice["token_ids"] = list(result.tokens) if result else []
        choice["prompt_token_ids"] = list(reply.job.prompt_ids)
    obj = "chat.completion" if reply.chat else "text_completion"
    return reply.envelope(obj, [choice], usage=reply.usage(result), spec_decode=reply.spec_decode(event))


async def stream(reply: Reply, request) -> AsyncIterator[str]:
    """Server-sent events: a chunk per step's text, the finish chunk with the spec-decode
    figures, usage when asked, then ``[DONE]``."""
    obj = "chat.completion.chunk" if reply.chat else "text_completion"

    def chunk(text: str | None, finish: str | None = None, first: bool = False) -> dict:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if reply.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        return reply.envelope(obj, [choice])

    def sse(body: dict) -> str:
        return f"data: {json.dumps(body)}\n\n"

    try:
        if reply.chat:
            yield sse(chunk(None, first=True))
        while True:
            event = await next_event(reply.job, request)
            if isinstance(event, Tokens):
                if event.text:
                    yield sse(chunk(event.text))
            elif isinstance(event, Finished):
                yield sse({**chunk(None, _finish(event.reason)), "spec_decode": reply.spec_decode(event)})
                if reply.req.include_usage:
                    yield sse(reply.envelope(obj, [], usage=reply.usage(event.result)))
                break
            elif isinstance(event, Failed | WaitedTooLong):
                message = event.message if isinstance(event, Failed) else "request timed out"
                yield sse({"error": {"message": message, "type": "server_error"}})
                break
            else:  # client gone
                return
        yield "data: [DONE]\n\n"
    finally:
        reply.job.cancelled.set()  # no-op once finished; stops the worker if the client went away


# ---------------------------------------------------------------------- the routes
def create_app(worker: Worker, tokenizer, metrics: Metrics, config: ServerConfig, *, shutdown_grace: float = 10.0):
    try:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    except ImportError:  # pragma: no cover - depends on the environment
        from dspark.errors import DSparkError

        raise DSparkError("serving needs FastAPI and uvicorn: pip install 'dspark[serve]'") from None
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(_app):
        yield
        await asyncio.to_thread(worker.shutdown, shutdown_grace)

    app = FastAPI(title="dspark", lifespan=lifespan)
    k = config.num_speculative_tokens if config.speculative else 0

    @app.exception_handler(APIError)
    async def _api_error(_request, exc: APIError):
        body = {"error": {"message": exc.message, "type": exc.kind, "param": exc.param, "code": exc.status}}
        return JSONResponse(body, status_code=exc.status)

    async def answer(req, job: Job, request: Request, chat: bool):
        submit(worker, job)
        reply = Reply(req, job, chat, config, k)
        if req.stream:
            return StreamingResponse(stream(reply, request), media_type="text/event-stream")
        return await complete(reply, request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = parse_request(CompletionRequest, await read_body(request), config)
        prompt = req.prompt
        ids = list(prompt) if isinstance(prompt, list) else tokenizer(prompt, add_special_tokens=True)["input_ids"]
        return await answer(req, make_job(req, ids, req.max_tokens, config), request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = parse_request(ChatCompletionRequest, await read_body(request), config)
        if not getattr(tokenizer, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template; use /v1/completions")
        messages = [{"role": m.role, "content": m.content} for m in req.messages]
        job = make_job(req, encode_prompt(tokenizer, messages), req.token_budget, config)
        return await answer(req, job, request, chat=True)

    @app.get("/v1/models")
    async def models():
        card = {"id": config.model_name, "object": "model", "created": 0, "owned_by": "dspark"}
        return {"object": "list", "data": [{**card, "max_model_len": config.max_model_len}]}

    @app.get("/health")
    async def health():
        if not worker.accepting:
            raise APIError(503, "shutting down", kind="service_unavailable")
        return {
            "status": "ok",
            "queued": worker.queue.qsize(),
            "busy": worker.busy.is_set(),
            "speculative": config.speculative,
            "num_speculative_tokens": k,
            "dtype": config.dtype,
            "batch": config.batch,
        }

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def _finish(reason: str) -> str:
    """Our finish details -> OpenAI's finish_reason."""
    return {"stop": "stop", "length": "length", "timeout": "length", "abort": "length"}.get(reason, reason)
