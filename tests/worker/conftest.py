"""Worker fixtures: real apps on the simulated engine, driven through httpx."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx
import pytest

from heddle.rollout import load_cluster
from heddle.scheduler import PerfModel
from heddle.worker import Engine, SimulatedEngine, create_app


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def sim_perf(batch_cap: int = 100) -> PerfModel:
    """Qwen3-14B on H100 (the paper's preset), optionally with a tiny batch cap."""
    return replace(load_cluster("64xh100").perf_model(), batch_cap=batch_cap)


@asynccontextmanager
async def worker(
    engine: Engine, *, grace_s: float = 5.0, **options: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The worker app with its lifespan running, reached over ASGI by an httpx client;
    ``options`` go to create_app (weights_roots, max_resident, ...)."""
    app = create_app(engine, grace_s=grace_s, **options)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            yield client


@pytest.fixture
def sim_engine() -> Callable[..., SimulatedEngine]:
    """Build simulated engines running 100x faster than the performance model says."""

    def build(**kwargs: object) -> SimulatedEngine:
        options: dict[str, object] = {"time_scale": 0.01, "max_model_len": 4096}
        options.update(kwargs)
        perf = options.pop("perf", sim_perf())
        return SimulatedEngine(perf, **options)  # type: ignore[arg-type]

    return build
