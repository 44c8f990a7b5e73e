"""Run a worker: uvicorn in front of the app, with a graceful SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

from heddle.exceptions import AddressInUseError, ConfigError

from ._app import WorkerState, create_app
from ._body_limit import MAX_BODY_BYTES
from ._engine import Engine
from ._http import KEEP_ALIVE_S

__all__ = ["listen_socket", "serve"]

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


@contextlib.contextmanager
def _signals_deferred() -> Iterator[list[int]]:
    """SIGTERM and SIGINT are recorded, not acted on, inside the block."""
    received: list[int] = []

    def record(sig: int, frame: FrameType | None) -> None:
        received.append(sig)

    previous = {s: signal.signal(s, record) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) on the server's address before the engine starts.

    Binding first holds the port through a model load of minutes: a launcher that
    picked a free port for this worker cannot lose it meanwhile to another process,
    and a taken port is one sentence at once, not a failure after the load. Until
    the server listens, connections are refused, as before the bind. :func:`serve`
    closes it just before uvicorn binds the address itself. (Handed to uvicorn as
    its listener instead, the session of tests/rollout/test_drafts_feed.py delivered
    43-49 of its 53 drafts, every run; why was not found.)
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUseError(
                f"cannot listen on {host}:{port}: the address is in use; pick another "
                "--port or stop what holds it"
            ) from exc
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; check --host") from exc
    return sock


def serve(
    engine: Engine,
    *,
    host: str,
    port: int,
    grace_s: float = 30.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    token: str | None = None,
    sock: socket.socket | None = None,
    **state: Any,
) -> None:
    """Serve ``engine`` until a signal; blocks. ``sock``: bound by :func:`listen_socket`
    on ``host:port`` (the CLI binds before its checks), held until the engine started;
    bound here when not given.
    ``token`` and ``state`` (max_resident, resident_ttl_s, weights_roots): see
    :func:`create_app`."""
    sock = sock if sock is not None else listen_socket(host, port)
    app = create_app(
        engine,
        grace_s=grace_s,
        max_body_bytes=max_body_bytes,
        token=token,
        engine_started=True,
        **state,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        timeout_graceful_shutdown=int(grace_s) + 5,
        timeout_keep_alive=KEEP_ALIVE_S,  # the session's pool reuses it through tool calls
    )

    async def run() -> None:
        # The engine starts before the server, so a refusal (a HeddleError, e.g. a context
        # longer than the model's) reaches the CLI as one sentence, not as uvicorn's
        # lifespan traceback; the app's lifespan still stops it. A signal during the start
        # waits for it, then stops the engine: dying mid-start would orphan vLLM's engine
        # process (uvicorn deferred signals the same way when the lifespan started it).
        with _signals_deferred() as received:
            await engine.start()
        if received:
            log.info("signal %s during start-up: stopping the engine", received[0])
            await engine.shutdown()
            return
        sock.close()  # the address is free again for uvicorn's own bind, a moment later
        await _Server(config, app.state.worker).serve()

    try:
        asyncio.run(run())
    finally:
        sock.close()
