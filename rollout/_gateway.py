"""The job's OpenAI-compatible gateway: episodes for outside agents, and their model calls.

Routes (docs/gateway.md), every one but ``/healthz`` behind the job's bearer
token (``Authorization: Bearer TOKEN``, the OpenAI SDK's ``api_key``):

- ``GET /v1/models``: the job's model.
- ``POST /v1/episodes``: the next episode (task and id), GRPO siblings in a row.
- ``POST /v1/chat/completions``: one model call of an episode, whose id goes in
  the ``X-Heddle-Trajectory`` header or the request's ``user`` field; streaming
  (server-sent events) or not, with ``tools`` and ``tool_choice``.
- ``POST /v1/episodes/{id}/end``: the episode is over, with an optional reward and info.

Errors have OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``.
A small Starlette app inside the session's process: the episodes live there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from heddle.exceptions import ConfigError
from heddle.worker import tool_schema_error

from ._external import ExternalEnvironment
from ._gateway_messages import ChatCall, ChatReply, GatewayError, normal_message

__all__ = ["TRAJECTORY_HEADER", "Gateway", "create_gateway_app"]

TRAJECTORY_HEADER = "X-Heddle-Trajectory"
MAX_BODY_BYTES = 32 << 20  # one request at most; an agent's whole conversation fits
_TOOL_CHOICES = ("auto", "none")


def _error(exc: GatewayError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def create_gateway_app(env: ExternalEnvironment) -> Starlette:
    """The gateway's ASGI app over ``env``'s episodes."""

    def authorised(request: Request) -> None:
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        # Bytes, not text: compare_digest refuses non-ASCII str (a 500), and a header is
        # latin-1 on the wire anyway.
        sent = token.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() != "bearer" or not secrets.compare_digest(sent, env.token.encode()):
            raise GatewayError(
                401,
                f"this gateway serves job {env.job} to holders of its token: send "
                "'Authorization: Bearer TOKEN' (the OpenAI SDK's api_key); `heddle run` "
                "prints the token",
                code="invalid_api_key",
                kind="authentication_error",
            )

    async def body_of(request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise GatewayError(413, f"the request is over {MAX_BODY_BYTES} bytes")
        # A chunked body declares no length: read it up to the cap, no further.
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise GatewayError(413, f"the request is over {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise GatewayError(400, f"the body is not valid JSON ({exc})") from None
        if not isinstance(body, dict):
            raise GatewayError(400, "the body must be a JSON object")
        return body

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                authorised(request)
                return await handler(request)
            except GatewayError as exc:
                return _error(exc)

        return run

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [_model_card(env)]})

    async def episodes(request: Request) -> Response:
        await body_of(request)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(env.started.wait(), 30.0)
        if not env.started.is_set():
            raise GatewayError(503, f"job {env.job} is still starting; ask again in a moment",
                               kind="server_error", code="starting")  # fmt: skip
        ep = env.hand_out()
        if ep is None:  # nothing to hand out now; `remaining` says whether to ask again
            return JSONResponse({"id": None, "object": "episode", "remaining": env.remaining})
        task = ep.task
        return JSONResponse(
            {
                "id": ep.episode_id,
                "object": "episode",
                "job": env.job,
                "model": env.model,
                "task": {
                    "id": task.id,
                    "messages": [dict(m) for m in task.messages],
                    "metadata": dict(task.metadata),
                    "fields": dict(task.fields),
                    "tools": None if task.tools is None else [dict(t) for t in task.tools],
                },
                "task_index": ep.task_index,
                "sample": ep.sample,
                "group_size": env.group_size,
                "remaining": env.remaining,
            }
        )

    async def end(request: Request) -> Response:
        ep = env.lookup(request.path_params["episode_id"])
        body = await body_of(request)
        reward = body.get("reward")
        if reward is not None and (
            isinstance(reward, bool)
            or not isinstance(reward, int | float)
            or not math.isfinite(reward)
        ):
            raise GatewayError(400, f"reward={reward!r} must be a finite number or null",
                               param="reward")  # fmt: skip
        info = body.get("info")
        if info is not None and not isinstance(info, dict):
            raise GatewayError(400, "info must be a JSON object or null", param="info")
        unknown = sorted(set(body) - {"reward", "info"})
        if unknown:
            raise GatewayError(400, f"unknown field(s) {unknown}; an end takes reward and info",
                               param=unknown[0])  # fmt: skip
        ep.end(None if reward is None else float(reward), info)
        return JSONResponse({"id": ep.episode_id, "object": "episode", "status": "ended"})

    async def chat(request: Request) -> Response:
        body = await body_of(request)
        call, ep_id, stream, usage = _parse_chat(env, request, body)
        ep = env.lookup(ep_id)
        repeated = ep.submit(call)
        if repeated is not None:
            call.reply.set_result(repeated)
        completion = f"chatcmpl-{secrets.token_hex(12)}"
        if stream:
            return StreamingResponse(
                _events(env, ep_id, call, completion, usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        gone = asyncio.ensure_future(_until_disconnected(request))
        try:
            waits: set[asyncio.Future[Any]] = {call.reply, gone}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not call.reply.done():
            ep.disconnected(call)
            return Response(status_code=499)  # nobody reads it
        reply = call.reply.result()  # a GatewayError set on it goes to guarded()
        return JSONResponse(_completion(env, completion, reply))

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "job": env.job})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        what = "no such route" if status == 404 else "method not allowed"
        return _error(GatewayError(status, f"{what}: {request.method} {request.url.path}; see "
                                   "docs/gateway.md for the gateway's routes"))  # fmt: skip

    async def bug(request: Request, exc: Exception) -> Response:
        what = f"{type(exc).__name__}: {exc}"
        return _error(GatewayError(500, f"the gateway failed on this request ({what}); please "
                                   "report it", kind="server_error"))  # fmt: skip

    return Starlette(
        routes=[
            Route("/v1/models", guarded(models), methods=["GET"]),
            Route("/v1/episodes", guarded(episodes), methods=["POST"]),
            Route("/v1/episodes/{episode_id:path}/end", guarded(end), methods=["POST"]),
            Route("/v1/chat/completions", guarded(chat), methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: not_found, Exception: bug},
    )


async def _until_disconnected(request: Request) -> None:
    """Returns when the client has gone (its body is read: only that can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _model_card(env: ExternalEnvironment) -> dict[str, Any]:
    return {"id": env.model, "object": "model", "created": 0, "owned_by": f"heddle/{env.job}"}


def _parse_chat(
    env: ExternalEnvironment, request: Request, body: Mapping[str, Any]
) -> tuple[ChatCall, str, bool, bool]:
    """(the call, its episode id, stream?, usage in the stream?) or a GatewayError."""
    model = body.get("model")
    if model != env.model:
        raise GatewayError(
            404,
            f"model {model!r} is not served here: this gateway serves job {env.job}'s model "
            f"{env.model!r} (GET /v1/models); point the agent at its own job's gateway",
            code="model_not_found",
            param="model",
        )
    episode_id = request.headers.get(TRAJECTORY_HEADER) or body.get("user")
    if not isinstance(episode_id, str) or not episode_id:
        raise GatewayError(
            400,
            f"the call names no episode: take one with POST /v1/episodes and send its id in "
            f"the {TRAJECTORY_HEADER} header or the request's user field",
            code="missing_trajectory",
            param="user",
        )
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise GatewayError(400, "messages must be a non-empty list", param="messages")
    messages = [normal_message(m, f"messages[{i}]") for i, m in enumerate(raw)]
    if body.get("n", 1) != 1:
        raise GatewayError(400, "n must be 1: each call is one step of one trajectory", param="n")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise GatewayError(400, "tools must be a list of function tools", param="tools")
    for i, tool in enumerate(tools):
        if (error := tool_schema_error(tool, f"tools[{i}]")) is not None:
            raise GatewayError(400, error, param=f"tools[{i}]")
    choice = body.get("tool_choice") or "auto"
    if choice not in _TOOL_CHOICES:
        raise GatewayError(
            400,
            f"tool_choice={choice!r} is not supported: the gateway samples each turn as the "
            "job's sampling says, unconstrained; use 'auto' (calls parsed when the model "
            "makes them) or 'none' (no parsing)",
            param="tool_choice",
        )
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise GatewayError(400, f"max_tokens={limit!r} must be a positive integer",
                           param="max_tokens")  # fmt: skip
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise GatewayError(400, "stream must be true or false", param="stream")
    options = body.get("stream_options") or {}
    usage = bool(isinstance(options, Mapping) and options.get("include_usage"))
    future: asyncio.Future[ChatReply] = asyncio.get_running_loop().create_future()
    return ChatCall(messages, list(tools), str(choice), limit, future), episode_id, stream, usage


def _usage(reply: ChatReply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def _completion(env: ExternalEnvironment, completion: str, reply: ChatReply) -> dict[str, Any]:
    return {
        "id": completion,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": env.model,
        "choices": [
            {
                "index": 0,
                "message": dict(reply.message),
                "finish_reason": reply.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": _usage(reply),
    }


def _chunks(
    env: ExternalEnvironment, completion: str, reply: ChatReply
) -> Iterator[dict[str, Any]]:
    """The reply as OpenAI's stream chunks: content, then tool calls, then the finish."""
    base = {"id": completion, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": env.model}  # fmt: skip

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                     "logprobs": None}]}  # fmt: skip

    message = reply.message
    if message.get("content"):
        yield chunk({"content": message["content"]})
    calls = message.get("tool_calls") or []
    if calls:
        yield chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
    yield chunk({}, reply.finish_reason)


async def _events(
    env: ExternalEnvironment, episode_id: str, call: ChatCall, completion: str, usage: bool
) -> AsyncIterator[bytes]:
    """Server-sent events: the role at once, the turn once its step is done, then [DONE].

    A turn is one worker step, so its text arrives whole at the end of the step; the
    first chunk goes out at once so a client's read timeout does not count the queue.
    """

    def sse(data: Any) -> bytes:
        return f"data: {json.dumps(data)}\n\n".encode()

    first = {"id": completion, "object": "chat.completion.chunk", "created": int(time.time()),
             "model": env.model, "choices": [{"index": 0, "delta": {"role": "assistant",
             "content": ""}, "finish_reason": None, "logprobs": None}]}  # fmt: skip
    try:
        yield sse(first)
        try:
            reply = await asyncio.shield(call.reply)
        except GatewayError as exc:
            yield sse(exc.body())
            return
        for chunk in _chunks(env, completion, reply):
            yield sse(chunk)
        if usage:
            yield sse({"id": completion, "object": "chat.completion.chunk",
                       "created": int(time.time()), "model": env.model, "choices": [],
                       "usage": _usage(reply)})  # fmt: skip
        yield b"data: [DONE]\n\n"
    finally:
        if not call.reply.done():  # the client went away mid-stream
            with contextlib.suppress(GatewayError):
                env.lookup(episode_id).disconnected(call)


class _Server(uvicorn.Server):
    """uvicorn inside a process that owns its signals (``heddle run``, the operator)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_bound(
    server: _Server, host: str, port: int, *, what: str, hint: str
) -> tuple[asyncio.Task[None], int]:
    """Serve ``server`` on ``host:port`` (0: a free port); the task and the bound port.

    Bound here, not by uvicorn, which exits the process when it cannot bind: a port in
    use is one sentence (``what`` cannot listen ..., ``hint``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it every reply waits ~40 ms on Nagle and the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"{what} cannot listen on {host}:{port} ({exc.strerror}); {hint}"
        ) from None
    bound = int(sock.getsockname()[1])
    task = asyncio.create_task(server.serve(sockets=[sock]), name=what)
    while not server.started:
        if task.done():
            task.result()
            raise ConfigError(f"{what} on {host}:{bound} stopped at its start")
        await asyncio.sleep(0.02)
    return task, bound


async def stop_served(server: _Server, task: asyncio.Task[None] | None) -> None:
    """Stop what :func:`serve_bound` started (nothing when ``task`` is None)."""
    if task is None:
        return
    server.should_exit = True
    with contextlib.suppress(asyncio.CancelledError):
        await task


class Gateway:
    """The gateway served on ``host:port`` (0: a free port) in the running event loop."""

    def __init__(self, env: ExternalEnvironment, host: str = "127.0.0.1", port: int = 0) -> None:
        self.env = env
        self._server = _Server(
            uvicorn.Config(
                create_gateway_app(env),
                host=host,
                port=port,
                log_level="warning",
                lifespan="off",
                timeout_keep_alive=30,
            )
        )
        self._task: asyncio.Task[None] | None = None
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        """The base URL an OpenAI client takes (``.../v1``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    async def start(self) -> str:
        self._task, self.port = await serve_bound(
            self._server,
            self.host,
            self.port,
            what="the gateway",
            hint="pick another with --gateway-host/--gateway-port",
        )
        return self.url

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_served(self._server, task)
