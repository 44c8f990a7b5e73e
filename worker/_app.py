"""The worker's HTTP API: trajectory-resident contexts in front of one engine."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ._engine import Engine, EngineError, Sampling
from ._schemas import (
    ExportResponse,
    GenerateRequest,
    GenerateResponse,
    ImportRequest,
    ImportResponse,
    StateResponse,
    Timings,
)

__all__ = ["WorkerState", "create_app"]


class ApiError(Exception):
    """An error answered with ``status`` and a sentence saying what is wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "heddle_worker_requests",
            "API requests by route template and status",
            ["route", "status"],
            registry=r,
        )
        self.generated = Counter("heddle_worker_generated_tokens", "tokens generated", registry=r)
        self.prompt = Counter("heddle_worker_prompt_tokens", "context tokens of steps", registry=r)
        self.cached = Counter(
            "heddle_worker_cached_tokens", "context tokens served from the prefix cache", registry=r
        )
        self.step_latency = Histogram(
            "heddle_worker_step_seconds",
            "latency of one generate step",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.resident = Gauge("heddle_worker_resident_trajectories", "contexts held", registry=r)
        self.kv_usage = Gauge("heddle_worker_kv_usage", "KV cache in use (0..1)", registry=r)
        self.running = Gauge("heddle_worker_running", "steps running", registry=r)
        self.waiting = Gauge("heddle_worker_waiting", "steps waiting", registry=r)
        self.imports = Counter("heddle_worker_imports", "contexts imported (PUT)", registry=r)
        self.exports = Counter("heddle_worker_exports", "contexts exported (GET)", registry=r)


@dataclass
class WorkerState:
    """Everything one worker process holds besides the engine."""

    engine: Engine
    grace_s: float = 30.0
    contexts: dict[str, list[int]] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)  # trajectories with a step in flight
    draining: bool = False
    metrics: _Metrics = field(default_factory=_Metrics)
    recent: deque[tuple[float, int]] = field(default_factory=deque)  # (time, tokens)
    started: float = field(default_factory=time.monotonic)

    def tokens_per_s(self, window_s: float = 10.0) -> float:
        now = time.monotonic()
        while self.recent and self.recent[0][0] < now - window_s:
            self.recent.popleft()
        span = min(window_s, max(1e-9, now - self.started))
        return sum(n for _, n in self.recent) / span

    async def drain(self) -> None:
        """Stop taking steps, let in-flight ones finish for ``grace_s``, abort the rest."""
        self.draining = True
        deadline = time.monotonic() + self.grace_s
        while self.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.busy:
            await self.engine.abort_all()


def _sentence(exc: RequestValidationError) -> tuple[int, str]:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        return (
            400,
            f"request body is not valid JSON: {detail.get('ctx', {}).get('error', '')}".strip(),
        )
    parts = []
    for e in errors:
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return 422, "invalid request: " + "; ".join(parts)


class _CountRequests:
    """Counts requests by route template and status, as plain ASGI.

    Starlette's ``@app.middleware("http")`` runs every request in an extra task
    with memory streams; at thousands of steps per second that was the
    worker's largest cost (docs/benchmarks.md, control-loop scale).
    """

    def __init__(self, app: Any, counter: Counter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def remember(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, remember)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")  # bounded labels
            self.counter.labels(f"{scope['method']} {route}", status[0]).inc()


def create_app(engine: Engine, *, grace_s: float = 30.0) -> FastAPI:
    """The worker app; the engine starts with the app and stops with it."""
    state = WorkerState(engine, grace_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            if not state.draining:
                await state.drain()
            await engine.shutdown()

    app = FastAPI(title="Heddle worker", lifespan=lifespan)
    app.state.worker = state
    m = state.metrics

    app.add_middleware(_CountRequests, counter=m.requests)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = _sentence(exc)
        return JSONResponse({"error": message}, status_code=status)

    def _context(trajectory_id: str) -> list[int]:
        context = state.contexts.get(trajectory_id)
        if context is None:
            raise ApiError(
                404,
                f"trajectory {trajectory_id!r} is not resident on this worker; "
                "send its context with PUT /v1/trajectories/{id} or append tokens to start it",
            )
        return context

    def _check_length(trajectory_id: str, tokens: int) -> None:
        if tokens > engine.max_model_len:
            raise ApiError(
                400,
                f"trajectory {trajectory_id!r} would hold {tokens} tokens, more than the "
                f"model's max length {engine.max_model_len}; end the trajectory or truncate it",
            )

    def _refuse_when_unavailable() -> None:
        if state.draining:
            raise ApiError(503, "the worker is shutting down; send the step to another worker")
        if not engine.ready:
            raise ApiError(503, "the engine is not ready (loading, or failed); retry later")

    @app.post("/v1/trajectories/{trajectory_id}/generate", response_model=GenerateResponse)
    async def generate(trajectory_id: str, body: GenerateRequest) -> Response:
        _refuse_when_unavailable()
        if trajectory_id in state.busy:
            raise ApiError(409, f"a step of trajectory {trajectory_id!r} is already running")
        appended: list[int] = []
        if body.append_token_ids is not None:
            appended = body.append_token_ids
        elif body.messages is not None:
            text = engine.render_chat([msg.model_dump() for msg in body.messages], True)
            appended = engine.encode(text)
        if body.reset and not appended:
            raise ApiError(422, "reset needs append_token_ids or messages to start from")
        if trajectory_id not in state.contexts and not appended:
            _context(trajectory_id)  # raises 404
        held = [] if body.reset else state.contexts.get(trajectory_id, [])
        if body.reset and trajectory_id in state.contexts:
            engine.release(trajectory_id)
        context = [*held, *appended]
        _check_length(trajectory_id, len(context))
        sampling = body.sampling
        max_tokens = min(sampling.max_tokens, engine.max_model_len - len(context))
        if max_tokens < 1:
            raise ApiError(
                400,
                f"trajectory {trajectory_id!r} holds {len(context)} tokens: no room left to "
                f"generate within the model's max length {engine.max_model_len}",
            )
        state.contexts[trajectory_id] = context
        state.busy.add(trajectory_id)
        started = time.monotonic()
        try:
            output = await engine.step(
                trajectory_id,
                context,
                Sampling(
                    max_tokens=max_tokens,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    seed=sampling.seed,
                    ignore_eos=sampling.ignore_eos,
                    logprobs=sampling.logprobs,
                    stop_token_ids=tuple(sampling.stop_token_ids),
                ),
                body.priority,
            )
        except EngineError as exc:
            raise ApiError(503, f"the engine failed: {exc}") from exc
        finally:
            state.busy.discard(trajectory_id)
        if output.finish_reason == "abort":
            raise ApiError(
                503, "the worker is shutting down and aborted this step; retry on another worker"
            )
        context.extend(output.token_ids)
        total = time.monotonic() - started
        m.generated.inc(len(output.token_ids))
        m.prompt.inc(output.prompt_tokens)
        m.cached.inc(output.cached_tokens)
        m.step_latency.observe(total)
        state.recent.append((time.monotonic(), len(output.token_ids)))
        reply = GenerateResponse(
            trajectory_id=trajectory_id,
            appended_token_ids=appended,
            token_ids=output.token_ids,
            text=engine.decode(output.token_ids),
            finish_reason=output.finish_reason,
            prompt_tokens=output.prompt_tokens,
            cached_tokens=output.cached_tokens,
            context_tokens=len(context),
            logprobs=output.logprobs,
            timings=Timings(
                queue_s=output.queue_s,
                prefill_s=output.prefill_s,
                decode_s=output.decode_s,
                total_s=total,
            ),
        )
        # Built and typed above; sent as is, so FastAPI does not validate it a second time.
        return Response(reply.model_dump_json(), media_type="application/json")

    @app.put("/v1/trajectories/{trajectory_id}", response_model=ImportResponse)
    async def import_context(trajectory_id: str, body: ImportRequest) -> ImportResponse:
        _refuse_when_unavailable()
        if trajectory_id in state.busy:
            raise ApiError(
                409, f"a step of trajectory {trajectory_id!r} is running; import it later"
            )
        _check_length(trajectory_id, len(body.token_ids))
        state.contexts[trajectory_id] = list(body.token_ids)
        if body.warm:
            await engine.warm(trajectory_id, state.contexts[trajectory_id])
        m.imports.inc()
        return ImportResponse(
            trajectory_id=trajectory_id, context_tokens=len(body.token_ids), warmed=body.warm
        )

    @app.get("/v1/trajectories/{trajectory_id}", response_model=ExportResponse)
    async def export_context(trajectory_id: str) -> ExportResponse:
        context = _context(trajectory_id)
        m.exports.inc()
        return ExportResponse(trajectory_id=trajectory_id, token_ids=list(context))

    @app.delete("/v1/trajectories/{trajectory_id}", status_code=204)
    async def release(trajectory_id: str) -> Response:
        _context(trajectory_id)
        if trajectory_id in state.busy:
            raise ApiError(
                409, f"a step of trajectory {trajectory_id!r} is running; release it later"
            )
        del state.contexts[trajectory_id]
        engine.release(trajectory_id)
        return Response(status_code=204)

    @app.get("/v1/state", response_model=StateResponse)
    async def worker_state() -> StateResponse:
        stats = engine.stats()
        return StateResponse(
            engine=engine.name,
            model=engine.model,
            tp=engine.tp,
            max_model_len=engine.max_model_len,
            ready=engine.ready and not state.draining,
            draining=state.draining,
            running=stats.running,
            waiting=stats.waiting,
            kv_usage=stats.kv_usage,
            resident_trajectories=len(state.contexts),
            generated_tokens=stats.generated_tokens,
            tokens_per_s=state.tokens_per_s(),
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        if state.draining:
            return JSONResponse({"ready": False, "reason": "shutting down"}, status_code=503)
        if not engine.ready:
            return JSONResponse({"ready": False, "reason": "engine not ready"}, status_code=503)
        return JSONResponse({"ready": True})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        stats = engine.stats()
        m.resident.set(len(state.contexts))
        m.kv_usage.set(stats.kv_usage)
        m.running.set(stats.running)
        m.waiting.set(stats.waiting)
        return PlainTextResponse(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    return app
