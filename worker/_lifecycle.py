"""The engine's life in a worker app: started with the app, drained and shut down with it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI

from ._app_state import WorkerState

__all__ = ["engine_lifespan"]


def engine_lifespan(
    state: WorkerState, *, engine_started: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: start the engine (unless ``engine_started``: the caller did);
    at the end drain the steps in flight (``grace_s``), stop the engine and the tokenizer."""
    engine = state.engine

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not engine_started:
            await engine.start()
        try:
            yield
        finally:
            if not state.draining:
                await state.drain()
            await engine.shutdown()
            state.tokenizer.shutdown(wait=False, cancel_futures=True)

    return lifespan
