"""The one thread that owns the target and the drafter, and the bounded queue in front of it.

The target's KV cache and the drafter's context cache hold one sequence at a time, so a
single worker thread decodes requests one after another: no two requests ever share a
cache, whatever the HTTP side does. Requests wait in a bounded queue (full queue ->
`QueueFullError`, the HTTP layer answers 429). Each request carries a cancel flag (client gone,
time-out, shutdown) that the engine checks after every verification step.

Events go back to the request's asyncio queue with ``loop.call_soon_threadsafe``: `Tokens`
as each step verifies them, then `Finished` or `Failed`.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dspark.decoding.engine import GenerationResult, SpeculativeEngine
from dspark.decoding.sampling import SamplingParams
from dspark.serve.metrics import Metrics


@dataclass(frozen=True)
class Tokens:
    """Tokens one step emitted, and the text they release (stop strings held back)."""

    ids: list[int]
    text: str


@dataclass(frozen=True)
class Finished:
    """The request is done: ``reason`` is stop, length, timeout or abort."""

    reason: str
    result: GenerationResult


@dataclass(frozen=True)
class Failed:
    """The request could not be served (an error, or the server shutting down)."""

    message: str


Event = Tokens | Finished | Failed


class QueueFullError(Exception):
    """The request queue is at its bound."""


class ShuttingDownError(Exception):
    """The server no longer takes requests."""


@dataclass
class Job:
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    seed: int | None
    stop: list[str]
    speculative: bool
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue  # of `Event`
    deadline: float  # time.monotonic() after which the job is cut short
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.monotonic)

    def emit(self, event: Event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class StopStrings:
    """Incremental detokenisation with stop strings: releases text that cannot begin a stop."""

    def __init__(self, decode: Callable[[list[int]], str], stops: list[str]) -> None:
        self.decode = decode
        self.stops = [s for s in stops if s]
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already released
        self.hit = False

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        text = self.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return ""
        cut = len(text)
        for s in self.stops:
            at = text.find(s, max(0, self.sent - len(s) + 1))
            if at >= 0 and at < cut:
                cut, self.hit = at, True
        if not self.hit:
            hold = max((len(s) - 1 for s in self.stops), default=0)
            for n in range(min(hold, len(text) - self.sent), 0, -1):
                if any(s.startswith(text[-n:]) for s in self.stops):
                    cut = len(text) - n
                    break
        delta = text[self.sent : cut] if cut > self.sent else ""
        self.sent = max(self.sent, cut)
        return delta

    def flush(self) -> str:
        if self.hit:
            return ""
        text = self.decode(self.ids)
        delta = text[self.sent :]
        self.sent = len(text)
        return delta


def cut_reason(job: Job, text: StopStrings) -> str | None:
    """Why a request ends after this step's tokens (a stop string, the client gone, its
    deadline), or None to go on."""
    if text.hit:
        return "stop"
    if job.cancelled.is_set():
        return "abort"
    if time.monotonic() > job.deadline:
        return "timeout"
    return None


class Worker:
    """Owns the engines; runs jobs one at a time from a bounded queue."""

    def __init__(
        self,
        build: Callable[[], tuple[SpeculativeEngine, SpeculativeEngine]],
        decode: Callable[[list[int]], str],
        *,
        max_queue: int,
        metrics: Metrics,
    ) -> None:
        """``build`` returns (speculative engine, plain engine); it runs on the worker thread,
        and the constructor returns once it has (re-raising what it raised).

        All torch work of the server happens on that one thread, loading included. Measured
        with the CPU (libgomp) build of torch on 2 cores (scripts/profile_target_forward.py, a probe in git at ff59591):
        once the main thread had run parallel kernels (loading the drafter does), plain
        decoding on another thread ran at 17.6 tok/s instead of 29.4; with
        OMP_WAIT_POLICY=PASSIVE every thread ran at the slow rate. So the likely cause is
        OpenMP threads that sleep between parallel regions instead of spinning once a second
        thread has its own team — not proven.
        """
        self.engines: dict[bool, SpeculativeEngine] = {}
        self.decode = decode
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.metrics = metrics
        self.accepting = True
        self.busy = threading.Event()
        self._ready = threading.Event()
        self._build_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(build,), name="dspark-worker", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._build_error is not None:
            self._thread.join()
            raise self._build_error

    @property
    def target(self):
        return self.engines[False].target

    # ------------------------------------------------------------------ submit / stop
    def submit(self, job: Job) -> None:
        if not self.accepting:
            raise ShuttingDownError
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            self.metrics.inc("dspark:requests_rejected_total")
            raise QueueFullError from None
        self.metrics.set("vllm:num_requests_waiting", self.queue.qsize())

    def shutdown(self, grace_seconds: float) -> None:
        """Stop taking requests; let queued and running ones finish within the grace period,
        then cut the rest short (they end with finish_reason "abort")."""
        self.accepting = False
        deadline = time.monotonic() + grace_seconds
        while (self.busy.is_set() or not self.queue.empty()) and time.monotonic() < deadline:
            time.sleep(0.05)
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.emit(Failed("the server is shutting down"))
        self._current_cancel()
        self.queue.put(None)
        self._thread.join(timeout=30)

    def _current_cancel(self) -> None:
        job = getattr(self, "_job", None)
        if job is not None:
            job.cancelled.set()

    # ------------------------------------------------------------------ the loop
    def _run(self, build: Callable[[], tuple[SpeculativeEngine, SpeculativeEngine]]) -> None:
        try:
            speculative, plain = build()
            self.engines = {True: speculative, False: plain}
        except BaseException as exc:  # noqa: BLE001 - handed to the constructor, which re-raises it
            self._build_error = exc
            return
        finally:
            self._ready.set()
        while True:
            job = self.queue.get()
            if job is None:
                return
            self.metrics.set("vllm:num_requests_waiting", self.queue.qsize())
            if job.cancelled.is_set():
                continue
            self._job = job
            self.busy.set()
            self.metrics.set("vllm:num_requests_running", 1)
            try:
                self._serve(job)
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the worker
                job.emit(Failed(f"{type(exc).__name__}: {exc}"))
                self.metrics.inc("dspark:request_errors_total")
            finally:
                self._job = None
                self.busy.clear()
                self.metrics.set("vllm:num_requests_running", 0)

    def _serve(self, job: Job) -> None:
        engine = self.engines[job.speculative]
        text = StopStrings(self.decode, job.stop)
        emitted: list[int] = []
        reason = {"value": None}

        def on_tokens(new: list[int]) -> bool:
            emitted.extend(new)
            job.emit(Tokens(new, text.push(new)))
            reason["value"] = cut_reason(job, text)
            return reason["value"] is not None

        generator = None
        if job.seed is not None:
            generator = torch.Generator(device=engine.target.device).manual_seed(job.seed)
        started = time.monotonic()
        result: GenerationResult = engine.generate(
            job.prompt_ids, max_new_tokens=job.max_tokens, params=job.params, generator=generator, on_tokens=on_tokens
        )
        tail = text.flush()
        if tail:
            job.emit(Tokens([], tail))
        finish = reason["value"]
        if finish is None:
            stops = engine.target.stop_token_ids()
            finish = "stop" if result.tokens and result.tokens[-1] in stops else "length"
        self.metrics.observe_request(job, result, time.monotonic() - started, started - job.enqueued_at, finish)
        job.emit(Finished(finish, result))


class BatchWorker(Worker):
    """Continuous batching: up to the engine's slots requests decode together, one target
    forward per step for all of them (`dspark.decoding.batch.BatchedEngine`). A request joins
    at the next step (one prefill) and leaves when it ends; stop strings, cancellation and
    deadlines act per request after every step, as in `Worker`.

    ``build`` returns ``(engine, new_sequence, target)``: a `BatchedEngine`, a function turning
    a `Job` into its `Sequence` (its own drafter and generator), and the target."""

    def _run(self, build) -> None:
        try:
            self.batch, self.new_sequence, self._target = build()
        except BaseException as exc:  # noqa: BLE001 - handed to the constructor, which re-raises it
            self._build_error = exc
            return
        finally:
            self._ready.set()
        self._running: dict = {}  # Sequence -> (job, StopStrings, started)
        stops = self.target.stop_token_ids()
        engine = self.batch
        while True:
            if not engine.active:
                # Idle: the worker may now block on the queue, so say so first (a graceful
                # shutdown waits while `busy` is set; /metrics counts no request running).
                self.metrics.set("vllm:num_requests_running", 0)
                self.busy.clear()
            while engine.free_slots:
                try:
                    job = self.queue.get(block=not self._running)
                except queue.Empty:
                    break
                if job is None:  # shutdown: whatever still runs ends with an error event
                    for running, _text, _t in self._running.values():
                        running.emit(Failed("the server is shutting down"))
                    return
                self.metrics.set("vllm:num_requests_waiting", self.queue.qsize())
                if job.cancelled.is_set():
                    continue
                self.busy.set()
                seq = None
                try:
                    seq = self.new_sequence(job)
                    self._running[seq] = (job, StopStrings(self.decode, job.stop), time.monotonic())
                    first = engine.add(seq)
                    self.metrics.inc("vllm:prefix_cache_queries", len(seq.prompt))
                    self.metrics.inc("vllm:prefix_cache_hits", engine.decoder.last_prefill_cached)
                except Exception as exc:  # noqa: BLE001 - one bad request must not stop the worker
                    self._running.pop(seq, None)
                    job.emit(Failed(f"{type(exc).__name__}: {exc}"))
                    self.metrics.inc("dspark:request_errors_total")
                    continue
                self._deliver(seq, first, stops)
            self.metrics.set("vllm:num_requests_running", len(engine.active))
            if not engine.active:
                continue  # idle: the top of the loop says so
            try:
                stepped = engine.step()
            except Exception as exc:  # noqa: BLE001 - the batch is lost; its requests fail, the worker stays
                for seq in list(engine.active):
                    engine.cancel(seq)
                for job, _text, _t in self._running.values():
                    job.emit(Failed(f"{type(exc).__name__}: {exc}"))
                    self.metrics.inc("dspark:request_errors_total")
                self._running.clear()
                continue
            size, drafts = engine.last_step
            self.metrics.inc("dspark:batch_steps", 1)
            self.metrics.inc("dspark:batch_sequence_steps", size)
            self.metrics.inc("dspark:batch_draft_tokens", drafts)
            if engine.last_rule is not None:  # the load-aware rule's choice and what its step took
                k, seconds = engine.last_rule
                self.metrics.inc("dspark:batch_rule_steps", 1, draft_length=str(k))
                self.metrics.inc("dspark:batch_rule_step_seconds", seconds, draft_length=str(k))
            for seq, new in stepped:
                self._deliver(seq, new, stops)

    @property
    def target(self):
        return self._target

    def _deliver(self, seq, new: list[int], stops: set[int]) -> None:
        job, text, started = self._running[seq]
        job.emit(Tokens(new, text.push(new)))
        reason = cut_reason(job, text)
        if reason is not None and not seq.finished:
            self.batch.cancel(seq)
        if not seq.finished:
            return
        del self._running[seq]
        tail = text.flush()
        if tail:
            job.emit(Tokens([], tail))
        if reason is None:
            reason = "stop" if seq.tokens and seq.tokens[-1] in stops else "length"
        result = seq.result()
        self.metrics.observe_request(job, result, time.monotonic() - started, started - job.enqueued_at, reason)
        job.emit(Finished(reason, result))

    def _current_cancel(self) -> None:
        for job, _text, _t in list(getattr(self, "_running", {}).values()):
            job.cancelled.set()
