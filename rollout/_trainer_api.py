"""The trainer's HTTP API on a running session: finished groups, batches, weight pushes.

Routes (docs/async.md, "Streaming groups"), every one but ``/healthz`` behind a
bearer token:

- ``GET /v1/groups/next?timeout_s=30``: the next complete GRPO group in take
  order (under ``heddle`` the oldest weight version first, completion order among
  equals; the baselines: completion order), each whole (``{"group": ..., "end": ...}``), or
  ``{"group": null, ...}`` when none came in time. ``end``: nothing comes after
  this answer (also on the final group), so a trainer stops asking.
- ``GET /v1/batches/next?timeout_s=30``: the next iteration's
  ``spec.asynchrony.groupsPerIteration`` groups in the same take order
  (``{"batch": ..., "end": ...}``).
- ``POST /v1/weights`` ``{"path", "version"}``: push new weights under the
  running rollout (``RolloutSession.push_weights``).
- ``POST /v1/release``: the trainer takes no more; the rest is written as it completes.
- ``GET /v1/stream``: counts, the version, and the length report.

Long polls rather than a server-sent stream: a trainer takes a group when it is
ready for one, and a group handed out is taken (written to the output), so
nothing sits in a socket buffer when a trainer dies. A small Starlette app in
the session's process, served like the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from heddle.api import WeightsSpec
from heddle.exceptions import ConfigError, HeddleError

from ._gateway import _Server, serve_bound, stop_served
from ._session import RolloutSession

__all__ = ["END_LINGER_S", "TRAINER_TOKEN_ENV", "TrainerServer", "create_trainer_app"]

TRAINER_TOKEN_ENV = "HEDDLE_TRAINER_TOKEN"  # the session pod's trainer API token (a Secret's)
MAX_WAIT_S = 300.0  # one long poll at most; the client asks again
# Served on after the session ends until a trainer was told so: one that is busy
# training on its last batch would otherwise find the port closed and take that
# for a failure. Bounded, for a trainer that died.
END_LINGER_S = 60.0


def _refuse(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "status": status}}, status_code=status)


def create_trainer_app(
    session: RolloutSession, token: str, told_end: asyncio.Event | None = None
) -> Starlette:
    """The trainer's ASGI app over ``session``'s group stream (``told_end``: set once an
    answer said nothing more comes)."""
    stream = session.groups
    told = told_end if told_end is not None else asyncio.Event()

    def ended() -> bool:
        if stream.ended:
            told.set()
            return True
        return False

    def authorised(request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        sent = given.strip().encode("utf-8", "surrogateescape")
        return scheme.lower() == "bearer" and secrets.compare_digest(sent, token.encode())

    def wait_of(request: Request) -> float:
        raw = request.query_params.get("timeout_s", "30")
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"timeout_s={raw!r} must be a number of seconds") from None
        if not 0 <= value <= MAX_WAIT_S:
            raise ConfigError(f"timeout_s={value:g} must be in [0, {MAX_WAIT_S:g}]")
        return value

    def guarded(handler: Any) -> Any:
        async def run(request: Request) -> Response:
            if not authorised(request):
                return _refuse(401, "send the trainer API's token: 'Authorization: Bearer TOKEN'")
            try:
                return await handler(request)  # type: ignore[no-any-return]
            except HeddleError as exc:  # bad input: one sentence
                return _refuse(400, str(exc))

        return run

    async def next_group(request: Request) -> Response:
        group = await stream.next_group(wait_of(request))
        body = None if group is None else group.as_json()
        return JSONResponse({"group": body, "end": ended()})

    async def next_batch(request: Request) -> Response:
        batch = await stream.next_batch(wait_of(request))
        body = None if batch is None else batch.as_json()
        return JSONResponse({"batch": body, "end": ended()})

    async def weights(request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError as exc:
            raise ConfigError(f"the body is not valid JSON ({exc})") from None
        path, version = (
            (body.get("path"), body.get("version"))
            if isinstance(body, dict)
            else (
                None,
                None,
            )
        )
        if not isinstance(path, str) or not path or not isinstance(version, str | int):
            raise ConfigError('send {"path": CHECKPOINT_DIR, "version": STRING_OR_INT}')
        if isinstance(version, bool):
            raise ConfigError("version must be a string or an integer, not a boolean")
        session.push_weights(WeightsSpec(path, str(version)))
        return JSONResponse({"weight_version": str(version), "state": stream.state()})

    async def release(request: Request) -> Response:
        stream.release()
        return JSONResponse(stream.state())

    async def state(request: Request) -> Response:
        return JSONResponse(stream.state())

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "job": session.job})

    return Starlette(
        routes=[
            Route("/v1/groups/next", guarded(next_group), methods=["GET"]),
            Route("/v1/batches/next", guarded(next_batch), methods=["GET"]),
            Route("/v1/weights", guarded(weights), methods=["POST"]),
            Route("/v1/release", guarded(release), methods=["POST"]),
            Route("/v1/stream", guarded(state), methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )


class TrainerServer:
    """The trainer API on ``host:port`` (0: a free port) in the running event loop.

    Starting it tells the session a trainer takes the groups (none is taken for it).
    """

    def __init__(
        self,
        session: RolloutSession,
        *,
        token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.session = session
        self.token = token or secrets.token_urlsafe(24)
        self.host, self.port = host, port
        self.told_end = asyncio.Event()
        config = uvicorn.Config(
            create_trainer_app(session, self.token, self.told_end),
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
            timeout_keep_alive=int(MAX_WAIT_S) + 30,
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> str:
        self.session.groups.follow()  # from here on a trainer takes the groups
        self._task, self.port = await serve_bound(
            self._server, self.host, self.port, what="the trainer API", hint="pick another port"
        )
        return self.url

    async def stop(self, linger_s: float = 0.0) -> None:
        """Stop serving; with ``linger_s``, first until a trainer was told the stream ended
        (at most that long). A cancel (Ctrl-C) cuts the linger: the server still stops
        cleanly before the cancel goes on."""
        try:
            if linger_s > 0 and self._task is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.told_end.wait(), linger_s)
        finally:
            task, self._task = self._task, None
            await asyncio.shield(stop_served(self._server, task))
