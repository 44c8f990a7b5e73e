"""The worker's HTTP API: trajectory-resident contexts in front of one engine."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from heddle.exceptions import CheckpointError, EngineInputError
from heddle.exceptions import RequestError as ApiError

from ._auth import BearerToken, document_auth
from ._body_limit import MAX_BODY_BYTES, BodyLimit
from ._chat import chat_delta
from ._drafts import DraftHistory
from ._engine import Engine, EngineError, Sampling, StepOutput
from ._resident import DEFAULT_MAX_RESIDENT, DEFAULT_RESIDENT_TTL_S, ResidentContexts
from ._schemas import (
    FIELD_RANGES,
    TOKEN_ID_FIELDS,
    ErrorResponse,
    ExportResponse,
    FunctionCall,
    GenerateRequest,
    GenerateResponse,
    HealthResponse,
    ImportRequest,
    ImportResponse,
    PurgeResponse,
    ReadyResponse,
    SeedDraftsRequest,
    SeedDraftsResponse,
    SpeculationState,
    StateResponse,
    StepSpeculation,
    Timings,
    ToolCall,
    WeightsRequest,
    WeightsResponse,
)
from ._speculation import SPECULATION_REFUSED_SAMPLING
from ._weights import weights_path
from ._weights_push import add_push_routes

__all__ = ["WorkerState", "create_app"]


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
        self.dropped = Counter(
            "heddle_worker_dropped_contexts",
            "resident contexts dropped: over the cap, idle past the TTL, or a job's purge",
            ["reason"],
            registry=r,
        )
        self.max_resident = Gauge(
            "heddle_worker_max_resident_trajectories", "the cap on resident contexts", registry=r
        )
        self.weights = Info("heddle_worker_weights", "the weights served", registry=r)
        # Speculative decoding, per step as vLLM counts it for each request.
        self.drafted = Counter(
            "heddle_worker_drafted_tokens", "draft tokens proposed (speculation)", registry=r
        )
        self.accepted = Counter(
            "heddle_worker_accepted_tokens", "draft tokens accepted (speculation)", registry=r
        )
        self.draft_steps = Counter(
            "heddle_worker_draft_steps",
            "engine steps that verified a draft, per sequence",
            registry=r,
        )
        self.weight_loads = Counter(
            "heddle_worker_weight_loads", "in-place loads by result", ["result"], registry=r
        )
        self.weight_load_s = Gauge(
            "heddle_worker_weight_load_seconds", "duration of the last in-place load", registry=r
        )


@dataclass
class WorkerState:
    """Everything one worker process holds besides the engine."""

    engine: Engine
    grace_s: float = 30.0
    contexts: ResidentContexts = field(default_factory=ResidentContexts)
    busy: set[str] = field(default_factory=set)  # trajectories with a step in flight
    draining: bool = False
    loading: str | None = None  # the weight version being loaded: steps wait or are refused
    aborted_for_weights: set[str] = field(default_factory=set)  # steps a load cut short
    metrics: _Metrics = field(default_factory=_Metrics)
    recent: deque[tuple[float, int]] = field(default_factory=deque)  # (time, tokens)
    started: float = field(default_factory=time.monotonic)
    # Tokenising a large body takes seconds: off the event loop, so /readyz keeps
    # answering. One thread: HF fast tokenizers are not safe to share across threads.
    tokenizer: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="heddle-tokenize")
    )

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

    async def settle(self) -> float:
        """Before a weight load: let in-flight steps finish for ``grace_s``, abort the rest."""
        started = time.monotonic()
        while self.busy and time.monotonic() < started + self.grace_s:
            await asyncio.sleep(0.05)
        if self.busy:
            self.aborted_for_weights.update(self.busy)
            await self.engine.abort_all()
        return time.monotonic() - started

    async def abort_now(self) -> None:
        """Stop taking steps and abort the in-flight ones at once (a second SIGTERM)."""
        self.draining = True
        await self.engine.abort_all()


_WATCH_AFTER_S = 0.05
"""A step still running after this long starts watching for its client leaving."""

_INLINE_TOKENIZE_CHARS = 16_384
"""Messages shorter than this are tokenised in place (well under a millisecond): a
thread hop would cost more. Longer ones go to the tokenizer thread."""


def _outside_vocabulary(where: str, token_id: object, vocab_size: int) -> str:
    return (
        f"invalid request: {where} holds token id {token_id}, outside the model's "
        f"vocabulary [0, {vocab_size}); send ids its tokenizer produced"
    )


def _sentence(exc: RequestValidationError, vocab_size: int) -> tuple[int, str]:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        return (
            400,
            f"request body is not valid JSON: {detail.get('ctx', {}).get('error', '')}".strip(),
        )
    parts = []
    for e in errors:
        loc = tuple(str(x) for x in e.get("loc", ()))
        if loc == ("body",) and e.get("type") == "missing":
            return 422, "the request needs a JSON body (docs/worker-api.md shows each one)"
        if loc == ("body",) and e.get("type") in {"model_attributes_type", "model_type"}:
            # An array, a string, or a body not sent as JSON.
            return 422, "the request body must be a JSON object sent as application/json"
        where = ".".join(x for x in loc if x != "body") or "body"
        field_ = where.rpartition(".")[0]
        if field_ in TOKEN_ID_FIELDS and e.get("type") == "greater_than_equal":
            return 422, _outside_vocabulary(field_, e.get("input"), vocab_size)
        bounds = FIELD_RANGES.get(where)
        if e.get("type") == "extra_forbidden" and loc[-1] in SPECULATION_REFUSED_SAMPLING:
            parts.append(
                f"{where} is not supported: vLLM refuses min_p and logit_bias wherever "
                "speculative decoding is configured, and a pool may speculate "
                "(spec.speculation); leave it out and shape sampling with temperature and top_p"
            )
        elif e.get("type") == "heddle":  # our validators' sentences name the field themselves
            parts.append(str(e.get("msg")))
        elif bounds is not None:
            parts.append(f"{where} must be a number in {bounds}, not {e.get('input')!r}")
        else:
            parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return 422, "invalid request: " + "; ".join(parts)


def _http_sentence(request: Request, exc: HTTPException) -> str:
    """Starlette's own errors (no route, wrong method, unreadable body) as sentences."""
    if exc.status_code == 404 and exc.detail == "Not Found":
        return (
            f"no endpoint {request.method} {request.url.path}; "
            "the worker's endpoints are listed in docs/worker-api.md and at /docs"
        )
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        return f"{request.url.path} does not take {request.method}; use one of: {allowed}"
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        return "request body could not be read: send a UTF-8 JSON object"
    return str(exc.detail)


_WHY = {
    400: "the body is not JSON, or the context would exceed the model's max length",
    404: "the trajectory is not resident on this worker",
    409: "a step of the trajectory is running",
    421: "the worker serves other weights than the step's weight_version",
    413: "the body is over the worker's --max-body-mib",
    422: "a field is invalid (named, with its valid range)",
    503: "not ready, loading weights, shutting down, or the engine failed: try another worker",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route answers: all ``{"error": ...}``."""
    return {s: {"model": ErrorResponse, "description": _WHY[s]} for s in statuses}


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


async def _until_disconnected(request: Request) -> None:
    """Returns when the client has gone (the body is read by now: only that can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _step_speculation(output: StepOutput) -> StepSpeculation | None:
    if output.drafted_tokens is None:
        return None
    accepted = output.accepted_tokens or 0
    return StepSpeculation(
        drafted_tokens=output.drafted_tokens,
        accepted_tokens=accepted,
        draft_steps=output.draft_steps or 0,
        decode_steps=max(0, len(output.token_ids) - accepted),
    )


def _speculation_state(engine: Engine) -> SpeculationState | None:
    spec = engine.speculation
    if not spec.on:
        return None
    stats = engine.stats()
    return SpeculationState(
        method=spec.method,
        num_speculative_tokens=spec.num_speculative_tokens,
        by_batch_size=[list(e) for e in spec.by_batch_size],
        drafted_tokens=stats.drafted_tokens,
        accepted_tokens=stats.accepted_tokens,
        draft_steps=stats.draft_steps,
        acceptance_rate=stats.accepted_tokens / stats.drafted_tokens
        if stats.drafted_tokens
        else 0.0,
    )


def create_app(
    engine: Engine,
    *,
    grace_s: float = 30.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    token: str | None = None,
    engine_started: bool = False,
    max_resident: int = DEFAULT_MAX_RESIDENT,
    resident_ttl_s: float = DEFAULT_RESIDENT_TTL_S,
    weights_roots: tuple[str, ...] = (),
) -> FastAPI:
    """The worker app; the engine starts with the app (unless ``engine_started``: the
    caller started it) and stops with it.

    With ``token``, every route but the probes and /metrics needs it as a bearer token.
    At most ``max_resident`` contexts stay resident, none idle longer than
    ``resident_ttl_s`` (:mod:`._resident`). ``POST /v1/weights`` loads only directories
    under ``weights_roots`` (none: it refuses every path).
    """
    state = WorkerState(engine, grace_s, contexts=ResidentContexts(max_resident, resident_ttl_s))
    drafts = DraftHistory()  # texts inserted into the engine's suffix cache, per job and task

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

    app = FastAPI(title="Heddle worker", lifespan=lifespan)
    app.state.worker = state
    m = state.metrics

    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    if token is not None:  # outside the body limit: a caller without the token sends nothing in
        app.add_middleware(BearerToken, token=token)
    app.add_middleware(_CountRequests, counter=m.requests)
    document_auth(app)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = _sentence(exc, engine.vocab_size)
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": _http_sentence(request, exc)},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        # Uvicorn still logs the traceback; the client gets the same JSON shape as always.
        return JSONResponse(
            {
                "error": f"the worker failed on this request ({type(exc).__name__}: {exc}); "
                "this is a bug in the worker, please report it with the worker's log"
            },
            status_code=500,
        )

    def _dropped(gone: list[str], reason: str) -> None:
        for trajectory in gone:
            engine.release(trajectory)
        if gone:
            m.dropped.labels(reason).inc(len(gone))

    def _hold(trajectory_id: str, context: list[int]) -> None:
        """Keep ``context`` resident; what the cap or the TTL drops goes from the engine too."""
        before = dict(state.contexts.dropped)
        gone = state.contexts.put(trajectory_id, context, state.busy)
        after = state.contexts.dropped
        for reason in ("ttl", "cap"):
            if after[reason] > before[reason]:
                m.dropped.labels(reason).inc(after[reason] - before[reason])
        for trajectory in gone:
            engine.release(trajectory)

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

    def _check_vocab(where: str, token_ids: Sequence[int]) -> None:
        if not token_ids:
            return
        for bad in (min(token_ids), max(token_ids)):
            if not 0 <= bad < engine.vocab_size:
                raise ApiError(422, _outside_vocabulary(where, bad, engine.vocab_size))

    def _refuse_when_unavailable() -> None:
        if state.draining:
            raise ApiError(503, "the worker is shutting down; send the step to another worker")
        if not engine.ready:
            raise ApiError(503, "the engine is not ready (loading, or failed); retry later")
        if state.loading is not None:
            raise ApiError(
                503,
                f"the worker is loading weights version {state.loading!r}; "
                "retry in a moment or on another worker",
            )

    async def _appended(body: GenerateRequest, held: list[int]) -> list[int]:
        if body.append_token_ids is not None:
            _check_vocab("append_token_ids", body.append_token_ids)
            return body.append_token_ids
        if body.messages is None:
            return []
        messages = [msg.model_dump(exclude_none=True) for msg in body.messages]

        def render(chat: list[dict[str, Any]], add_generation_prompt: bool) -> str:
            return engine.render_chat(chat, add_generation_prompt, body.tools)

        def tokenize() -> list[int]:
            try:
                return chat_delta(render, engine.encode, messages, held[-1] if held else None)
            except ValueError as exc:
                raise ApiError(422, f"messages cannot be appended: {exc}") from exc

        if sum(len(msg.content) for msg in body.messages) < _INLINE_TOKENIZE_CHARS:
            return tokenize()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(state.tokenizer, tokenize)

    def _parsed(body: GenerateRequest, text: str) -> dict[str, Any]:
        """The reply's tool_calls and content, when the request names a parser the engine has."""
        if body.tool_parser is None:
            return {}
        try:
            turn = engine.parse_tool_calls(text, body.tool_parser, body.tools)
        except EngineInputError as exc:
            raise ApiError(422, f"invalid request: {exc}") from exc
        if turn is None:
            return {}
        calls = [
            ToolCall(id=id_, function=FunctionCall(name=name, arguments=arguments))
            for id_, name, arguments in turn.tool_calls
        ]
        return {"tool_calls": calls, "content": turn.content}

    async def _step(
        request: Request, trajectory_id: str, context: list[int], sampling: Sampling, priority: int
    ) -> StepOutput | None:
        """The engine's step, cancelled (vLLM: aborted) if the client goes away meanwhile:
        then ``None``."""
        # Watching needs a task reading the connection; a step shorter than the delay
        # (most, at scale) never pays for one. A watcher cancels this task when it sees
        # the client go.
        this = asyncio.current_task()
        assert this is not None
        watchers: list[asyncio.Task[None]] = []
        stepping = [True]  # a callback already scheduled must not cancel what comes after

        def cancel_step(watcher: asyncio.Future[None]) -> None:
            if stepping[0] and not watcher.cancelled():
                this.cancel()

        def watch() -> None:
            watchers.append(asyncio.ensure_future(_until_disconnected(request)))
            watchers[0].add_done_callback(cancel_step)

        timer = asyncio.get_running_loop().call_later(_WATCH_AFTER_S, watch)
        try:
            return await engine.step(trajectory_id, context, sampling, priority)
        except asyncio.CancelledError:
            gone = watchers and watchers[0].done() and not watchers[0].cancelled()
            if gone and this.uncancel() == 0:
                return None  # cancelled by the client's leaving, not by the server
            raise
        except EngineInputError as exc:
            raise ApiError(422, f"invalid request: the engine refused it: {exc}") from exc
        except EngineError as exc:
            raise ApiError(503, f"the engine failed: {exc}") from exc
        finally:
            stepping[0] = False
            timer.cancel()
            for watcher in watchers:
                watcher.cancel()

    @app.post(
        "/v1/trajectories/{trajectory_id}/generate",
        response_model=GenerateResponse,
        responses=_errors(400, 404, 409, 413, 421, 422, 503),
    )
    async def generate(trajectory_id: str, body: GenerateRequest, request: Request) -> Response:
        _refuse_when_unavailable()
        served = engine.weights.version if engine.weights else None
        if body.weight_version is not None and body.weight_version != served:
            raise ApiError(
                421,
                f"the worker serves weights version {served!r}, the step asks for "
                f"{body.weight_version!r}; load them with POST /v1/weights, then retry",
            )
        if trajectory_id in state.busy:
            raise ApiError(409, f"a step of trajectory {trajectory_id!r} is already running")
        _check_vocab("sampling.stop_token_ids", body.sampling.stop_token_ids)
        state.busy.add(trajectory_id)  # from here: tokenising yields to other requests
        previous = state.contexts.get(trajectory_id)
        reply = None
        try:
            reply = await _generate(trajectory_id, body, request, previous)
        finally:
            state.busy.discard(trajectory_id)
            if reply is None:  # a step that did not finish leaves the context as it was
                if previous is None:
                    state.contexts.pop(trajectory_id)
                else:
                    _hold(trajectory_id, previous)
        if reply is None:
            # The client went away: nobody reads this; 499 keeps it apart from failures.
            return JSONResponse({"error": "the client went away; step cancelled"}, 499)
        return reply

    async def _generate(
        trajectory_id: str, body: GenerateRequest, request: Request, previous: list[int] | None
    ) -> Response | None:
        """The step's answer, or ``None`` if the client went away before it finished."""
        received = time.monotonic()
        held = [] if body.reset or previous is None else previous
        appended = await _appended(body, held)
        if body.reset and not appended:
            raise ApiError(422, "reset needs append_token_ids or messages to start from")
        if previous is None and not appended:
            _context(trajectory_id)  # raises 404
        if body.reset and previous is not None:
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
        if body.tool_parser is not None:
            _parsed(body, "")  # a parser that does not fit the model fails before the step
        _hold(trajectory_id, context)
        started = time.monotonic()
        output = await _step(
            request,
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
        if output is None:
            return None
        if output.finish_reason == "abort":
            for_weights = trajectory_id in state.aborted_for_weights
            state.aborted_for_weights.discard(trajectory_id)
            why = "is loading new weights" if for_weights else "is shutting down"
            raise ApiError(503, f"the worker {why} and aborted this step; retry on another worker")
        context.extend(output.token_ids)
        total = time.monotonic() - started
        m.generated.inc(len(output.token_ids))
        m.prompt.inc(output.prompt_tokens)
        m.cached.inc(output.cached_tokens)
        m.step_latency.observe(total)
        speculation = _step_speculation(output)
        if speculation is not None:
            m.drafted.inc(speculation.drafted_tokens)
            m.accepted.inc(speculation.accepted_tokens)
            m.draft_steps.inc(speculation.draft_steps)
        state.recent.append((time.monotonic(), len(output.token_ids)))
        text = engine.decode(output.token_ids)
        reply = GenerateResponse(
            trajectory_id=trajectory_id,
            appended_token_ids=appended,
            token_ids=output.token_ids,
            text=text,
            finish_reason=output.finish_reason,
            prompt_tokens=output.prompt_tokens,
            cached_tokens=output.cached_tokens,
            context_tokens=len(context),
            logprobs=output.logprobs,
            **_parsed(body, text),
            timings=Timings(
                queue_s=output.queue_s,
                prefill_s=output.prefill_s,
                decode_s=output.decode_s,
                total_s=total,
                handle_s=time.monotonic() - received,
            ),
            speculation=speculation,
        )
        # Built and typed above; sent as is, so FastAPI does not validate it a second time.
        return Response(reply.model_dump_json(), media_type="application/json")

    @app.put(
        "/v1/trajectories/{trajectory_id}",
        response_model=ImportResponse,
        responses=_errors(400, 409, 413, 422, 503),
    )
    async def import_context(trajectory_id: str, body: ImportRequest) -> ImportResponse:
        _refuse_when_unavailable()
        if trajectory_id in state.busy:
            raise ApiError(
                409, f"a step of trajectory {trajectory_id!r} is running; import it later"
            )
        _check_length(trajectory_id, len(body.token_ids))
        _check_vocab("token_ids", body.token_ids)
        context = list(body.token_ids)
        _hold(trajectory_id, context)
        if body.warm:
            try:
                await engine.warm(trajectory_id, context)
            except EngineInputError as exc:
                raise ApiError(422, f"invalid request: the engine refused it: {exc}") from exc
            except EngineError as exc:
                raise ApiError(503, f"the engine failed: {exc}") from exc
        m.imports.inc()
        return ImportResponse(
            trajectory_id=trajectory_id, context_tokens=len(body.token_ids), warmed=body.warm
        )

    @app.get(
        "/v1/trajectories/{trajectory_id}", response_model=ExportResponse, responses=_errors(404)
    )
    async def export_context(trajectory_id: str) -> ExportResponse:
        context = _context(trajectory_id)
        m.exports.inc()
        return ExportResponse(trajectory_id=trajectory_id, token_ids=list(context))

    @app.delete("/v1/trajectories/{trajectory_id}", status_code=204, responses=_errors(404, 409))
    async def release(trajectory_id: str) -> Response:
        _context(trajectory_id)
        if trajectory_id in state.busy:
            raise ApiError(
                409, f"a step of trajectory {trajectory_id!r} is running; release it later"
            )
        state.contexts.pop(trajectory_id)
        engine.release(trajectory_id)
        return Response(status_code=204)

    @app.delete("/v1/trajectories", response_model=PurgeResponse, responses=_errors(422))
    async def purge(job: str) -> PurgeResponse:
        """Drop every resident context of ``job``: its session calls this when it starts
        (a predecessor's leftovers) and when it ends."""
        gone = state.contexts.purge(job, state.busy)
        _dropped(gone, "purge")
        drafts.purge(job)
        return PurgeResponse(job=job, released=len(gone))

    @app.post(
        "/v1/drafts", response_model=SeedDraftsResponse, responses=_errors(400, 413, 422, 503)
    )
    async def seed_drafts(body: SeedDraftsRequest) -> SeedDraftsResponse:
        """Texts the engine's suffix cache should draft from (siblings run elsewhere, earlier
        iterations of the task): inserted once each; a no-op where it does not run suffix."""
        _refuse_when_unavailable()
        for i, text in enumerate(body.texts):
            _check_vocab(f"texts[{i}]", text)
        seeded = 0
        for key, tokens in drafts.new(body.job, body.task_id, body.texts):
            seeded += await engine.seed_drafts(key, tokens)
        return SeedDraftsResponse(seeded=seeded, held=drafts.held(body.job, body.task_id))

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
            speculation=_speculation_state(engine),
        )

    @app.post(
        "/v1/weights", response_model=WeightsResponse, responses=_errors(400, 409, 413, 422, 503)
    )
    async def load_weights(body: WeightsRequest) -> WeightsResponse:
        _refuse_when_unavailable()
        if pushes.current is not None:
            raise ApiError(
                409,
                f"weights version {pushes.current.plan.version!r} are being pushed to this "
                "worker; load from disk once GET /v1/weights/push/{version} has answered",
            )
        try:
            weights_path(body.path, weights_roots)
        except CheckpointError as exc:
            m.weight_loads.labels("refused").inc()
            raise ApiError(422, str(exc)) from exc
        held = engine.weights
        if held is not None and (held.path, held.version) == (body.path, body.version):
            return WeightsResponse(
                path=body.path, version=body.version, loaded=False, load_s=0.0, drained_s=0.0
            )
        state.loading = body.version
        kept = len(state.busy) if body.mode == "keep" else 0
        try:
            # keep: steps in flight stay inside the paused engine (their KV kept), no drain
            drained_s = 0.0 if body.mode == "keep" else await state.settle()
            loaded = await engine.load_weights(body.path, body.version, keep=body.mode == "keep")
        except CheckpointError as exc:
            m.weight_loads.labels("refused").inc()
            version = held.version if held is not None else None
            raise ApiError(
                422, f"{exc}; the worker keeps serving weights version {version!r}"
            ) from exc
        except EngineError as exc:
            m.weight_loads.labels("failed").inc()
            raise ApiError(503, f"the engine failed while loading weights: {exc}") from exc
        finally:
            state.loading = None
        m.weight_loads.labels("loaded").inc()
        m.weight_load_s.set(loaded.load_s)
        return WeightsResponse(
            path=loaded.path,
            version=body.version,
            loaded=True,
            load_s=loaded.load_s,
            drained_s=drained_s,
            mode=body.mode,
            kept=kept,
        )

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
        _dropped(state.contexts.expire(state.busy), "ttl")
        m.resident.set(len(state.contexts))
        m.max_resident.set(state.contexts.max_resident)
        m.kv_usage.set(stats.kv_usage)
        m.running.set(stats.running)
        m.waiting.set(stats.waiting)
        if engine.weights is not None:
            m.weights.info({"version": engine.weights.version or "", "path": engine.weights.path})
        return PlainTextResponse(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    # weights over a process group; never at the same time as a load from disk
    pushes = add_push_routes(app, engine, m, _refuse_when_unavailable, lambda: state.loading)
    return app
