"""Run a worker: uvicorn in front of the app, with a graceful SIGTERM."""

from __future__ import annotations

import asyncio
import logging
from types import FrameType
from typing import Any

import uvicorn

from ._app import WorkerState, create_app
from ._body_limit import MAX_BODY_BYTES
from ._engine import Engine

__all__ = ["serve"]

log = logging.getLogger("heddle.worker")


class _Server(uvicorn.Server):
    """First SIGTERM/SIGINT drains (readyz turns 503, new steps get 503, in-flight
    steps get ``grace_s`` to finish, the rest are aborted), then the server exits.
    A second signal aborts every step at once and exits as soon as their answers are out."""

    def __init__(self, config: uvicorn.Config, state: WorkerState) -> None:
        super().__init__(config)
        self.worker = state
        self._draining: asyncio.Task[None] | None = None
        self._aborting: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining is not None:
            # uvicorn alone would wait for the open steps (its graceful timeout): abort them.
            log.info("signal %s again: aborting every step and exiting now", sig)
            self._draining.cancel()
            self._aborting = asyncio.get_event_loop().create_task(self._abort_then_exit())
            return
        log.info("signal %s: draining for up to %.1fs", sig, self.worker.grace_s)
        loop = asyncio.get_event_loop()
        self._draining = loop.create_task(self._drain_then_exit())

    async def _abort_then_exit(self) -> None:
        await self.worker.abort_now()
        await asyncio.sleep(0.2)  # let the aborted steps' 503 answers go out
        self.should_exit = True

    async def _drain_then_exit(self) -> None:
        await self.worker.drain()
        await asyncio.sleep(0.2)  # let the aborted steps' 503 answers go out
        self.should_exit = True


def serve(
    engine: Engine,
    *,
    host: str,
    port: int,
    grace_s: float = 30.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    token: str | None = None,
    **state: Any,
) -> None:
    """Serve ``engine`` until a signal; blocks. ``token`` and ``state`` (max_resident,
    resident_ttl_s, weights_roots): see :func:`create_app`."""
    app = create_app(engine, grace_s=grace_s, max_body_bytes=max_body_bytes, token=token, **state)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="info", timeout_graceful_shutdown=int(grace_s) + 5
    )
    asyncio.run(_Server(config, app.state.worker).serve())
