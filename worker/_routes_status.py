"""What a worker says about itself: ``GET /v1/state``, the probes and ``/metrics``.

``/healthz`` (the process answers), ``/readyz`` (the engine takes steps) and
``/metrics`` stay open without the pool's token (``_auth.OPEN_PATHS``).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ._app_state import WorkerState, dropped
from ._engine import Engine
from ._schemas import (
    HealthResponse,
    MeasuredKState,
    ReadyResponse,
    SpeculationState,
    StateResponse,
)

__all__ = ["add_probe_routes", "add_state_route"]


async def _speculation_state(engine: Engine) -> SpeculationState | None:
    spec = engine.speculation
    if not spec.on:
        return None
    stats = engine.stats()
    measured = await engine.k_table()
    table = [list(e) for e in spec.by_batch_size]
    if measured is not None:
        table = [[int(v) for v in row] for row in measured["by_batch_size"]]
    return SpeculationState(
        method=spec.method,
        num_speculative_tokens=spec.num_speculative_tokens,
        by_batch_size=table,
        measured=None if measured is None else MeasuredKState(**measured),
        drafted_tokens=stats.drafted_tokens,
        accepted_tokens=stats.accepted_tokens,
        draft_steps=stats.draft_steps,
        acceptance_rate=stats.accepted_tokens / stats.drafted_tokens
        if stats.drafted_tokens
        else 0.0,
    )


def add_state_route(app: FastAPI, state: WorkerState) -> None:
    """``GET /v1/state`` on ``app``."""
    engine = state.engine

    @app.get("/v1/state", response_model=StateResponse)
    async def worker_state() -> StateResponse:
        stats = engine.stats()
        return StateResponse(
            engine=engine.name,
            model=engine.model,
            tp=engine.tp,
            max_model_len=engine.max_model_len,
            vocab_size=engine.vocab_size,
            ready=engine.ready and not state.draining,
            draining=state.draining,
            running=stats.running,
            waiting=stats.waiting,
            kv_usage=stats.kv_usage,
            resident_trajectories=len(state.contexts),
            max_resident=state.contexts.max_resident,
            resident_ttl_s=state.contexts.ttl_s,
            dropped_contexts=dict(state.contexts.dropped),
            generated_tokens=stats.generated_tokens,
            tokens_per_s=state.tokens_per_s(),
            weight_version=engine.weights.version if engine.weights else None,
            weights_path=engine.weights.path if engine.weights else None,
            speculation=await _speculation_state(engine),
        )


def add_probe_routes(app: FastAPI, state: WorkerState) -> None:
    """``/healthz``, ``/readyz`` and ``/metrics`` on ``app``."""
    engine, m = state.engine, state.metrics

    @app.get("/healthz", response_model=HealthResponse)
    async def healthz() -> HealthResponse:
        return HealthResponse(status="ok")

    @app.get(
        "/readyz",
        response_model=ReadyResponse,
        responses={503: {"model": ReadyResponse, "description": "loading, failed or draining"}},
    )
    async def readyz() -> JSONResponse:
        if state.draining:
            return JSONResponse({"ready": False, "reason": "shutting down"}, status_code=503)
        if not engine.ready:
            return JSONResponse({"ready": False, "reason": "engine not ready"}, status_code=503)
        return JSONResponse({"ready": True})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        stats = engine.stats()
        dropped(state, state.contexts.expire(state.busy), "ttl")
        m.resident.set(len(state.contexts))
        m.max_resident.set(state.contexts.max_resident)
        m.kv_usage.set(stats.kv_usage)
        m.running.set(stats.running)
        m.waiting.set(stats.waiting)
        if engine.weights is not None:
            m.weights.info({"version": engine.weights.version or "", "path": engine.weights.path})
        return PlainTextResponse(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
