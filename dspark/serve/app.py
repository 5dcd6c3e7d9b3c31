"""The HTTP side: an OpenAI-compatible API over the `Worker`.

``/v1/completions``, ``/v1/chat/completions`` (JSON or SSE streaming), ``/v1/models``,
``/health``, ``/metrics``. Errors follow OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``): 400 for a malformed or invalid
request, 429 when the queue is full, 503 while shutting down, 504 when a request waited past
its time-out. Every response carries the request's speculative-decoding figures in an extra
``spec_decode`` object (OpenAI clients expose it as ``response.model_extra``).

(No ``from __future__ import annotations`` here: FastAPI must resolve the ``Request``
annotations of handlers defined inside `create_app` at runtime.)
"""

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from dspark.decoding.sampling import SamplingParams
from dspark.serve.metrics import Metrics
from dspark.serve.protocol import ChatCompletionRequest, CompletionRequest
from dspark.serve.worker import Job, QueueFullError, ShuttingDownError, Worker
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


def create_app(worker: Worker, tokenizer, metrics: Metrics, config: ServerConfig, *, shutdown_grace: float = 10.0):
    try:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
        from pydantic import ValidationError
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

    async def read_body(request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"malformed JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        return body

    def parse(model_cls, body: dict):
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

    def make_job(req, prompt_ids: list[int], max_tokens: int | None) -> Job:
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
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({budget}) exceeds the "
                f"context length {config.max_model_len}",
                param="max_tokens",
            )
        budget = min(budget, room)
        params = SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p)
        loop = asyncio.get_running_loop()
        return Job(
            prompt_ids=prompt_ids,
            max_tokens=budget,
            params=params,
            seed=req.seed,
            stop=req.stop_list,
            speculative=config.speculative,
            loop=loop,
            events=asyncio.Queue(),
            deadline=time.monotonic() + config.request_timeout,
        )

    def submit(job: Job) -> None:
        try:
            worker.submit(job)
        except QueueFullError:
            raise APIError(429, "the server is at its request bound; retry later", kind="rate_limit_error") from None
        except ShuttingDownError:
            raise APIError(503, "the server is shutting down", kind="service_unavailable") from None

    async def next_event(job: Job, request: Request):
        """The next worker event; cancels the job if the client goes away or it waits too long."""
        while True:
            try:
                return await asyncio.wait_for(job.events.get(), timeout=0.25)
            except TimeoutError:
                if await request.is_disconnected():
                    job.cancelled.set()
                    return ("gone", None)
                if time.monotonic() > job.deadline + 1.0 and not job.cancelled.is_set():
                    job.cancelled.set()  # still queued: the worker will skip it
                    return ("timeout", None)

    def usage(prompt_len: int, result) -> dict:
        n = len(result.tokens) if result else 0
        return {"prompt_tokens": prompt_len, "completion_tokens": n, "total_tokens": prompt_len + n}

    async def respond(req, job: Job, request: Request, chat: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if not req.stream:
            text = []
            while True:
                kind, *payload = await next_event(job, request)
                if kind == "tokens":
                    text.append(payload[1])
                elif kind == "done":
                    info = payload[0]
                    break
                elif kind == "error":
                    raise APIError(500, payload[0], kind="server_error")
                elif kind == "timeout":
                    raise APIError(
                        504, f"the request waited longer than {config.request_timeout:.0f} s", kind="timeout"
                    )
                else:  # client gone: nobody to answer
                    return JSONResponse({}, status_code=499)
            result, finish = info["result"], _finish(info["finish_reason"])
            choice = {"index": 0, "finish_reason": finish, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": "".join(text)}
            else:
                choice["text"] = "".join(text)
            if req.return_token_ids:
                choice["token_ids"] = list(result.tokens) if result else []
                choice["prompt_token_ids"] = list(job.prompt_ids)
            return {
                "id": rid,
                "object": obj,
                "created": created,
                "model": config.model_name,
                "choices": [choice],
                "usage": usage(len(job.prompt_ids), result),
                "spec_decode": {**spec_decode_summary(result, k), "finish_detail": info["finish_reason"]},
            }

        async def events():
            chunk_obj = "chat.completion.chunk" if chat else "text_completion"

            def chunk(delta_text: str | None, finish=None, first=False) -> str:
                choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
                if chat:
                    delta = {"role": "assistant", "content": ""} if first else {}
                    if delta_text:
                        delta["content"] = delta_text
                    choice["delta"] = delta
                else:
                    choice["text"] = delta_text or ""
                body = {
                    "id": rid,
                    "object": chunk_obj,
                    "created": created,
                    "model": config.model_name,
                    "choices": [choice],
                }
                return f"data: {json.dumps(body)}\n\n"

            try:
                if chat:
                    yield chunk(None, first=True)
                while True:
                    kind, *payload = await next_event(job, request)
                    if kind == "tokens":
                        if payload[1]:
                            yield chunk(payload[1])
                    elif kind == "done":
                        info = payload[0]
                        result = info["result"]
                        body = json.loads(chunk(None, _finish(info["finish_reason"]))[6:])
                        body["spec_decode"] = {**spec_decode_summary(result, k), "finish_detail": info["finish_reason"]}
                        yield f"data: {json.dumps(body)}\n\n"
                        if req.include_usage:
                            tail = {
                                "id": rid,
                                "object": chunk_obj,
                                "created": created,
                                "model": config.model_name,
                                "choices": [],
                                "usage": usage(len(job.prompt_ids), result),
                            }
                            yield f"data: {json.dumps(tail)}\n\n"
                        break
                    elif kind in ("error", "timeout"):
                        message = payload[0] if kind == "error" else "request timed out"
                        yield f"data: {json.dumps({'error': {'message': message, 'type': 'server_error'}})}\n\n"
                        break
                    else:
                        return
                yield "data: [DONE]\n\n"
            finally:
                job.cancelled.set()  # no-op after "done"; stops the worker if the client went away

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = parse(CompletionRequest, await read_body(request))
        prompt = req.prompt
        ids = list(prompt) if isinstance(prompt, list) else tokenizer(prompt, add_special_tokens=True)["input_ids"]
        job = make_job(req, ids, req.max_tokens)
        submit(job)
        return await respond(req, job, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = parse(ChatCompletionRequest, await read_body(request))
        if not getattr(tokenizer, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template; use /v1/completions")
        messages = [{"role": m.role, "content": m.content} for m in req.messages]
        job = make_job(req, encode_prompt(tokenizer, messages), req.token_budget)
        submit(job)
        return await respond(req, job, request, chat=True)

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": config.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "dspark",
                    "max_model_len": config.max_model_len,
                }
            ],
        }

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
        }

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def _finish(reason: str) -> str:
    """Our finish details -> OpenAI's finish_reason."""
    return {"stop": "stop", "length": "length", "timeout": "length", "abort": "length"}.get(reason, reason)
