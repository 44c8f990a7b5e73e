"""``/v1/trajectories``: trajectory-resident contexts and their steps.

A step (``POST /v1/trajectories/{id}/generate``) appends tokens or chat
messages to the resident context, runs on the engine (cancelled if the client
goes away) and keeps the grown context resident. ``PUT`` imports a context (a
migration, a recompute), ``GET`` exports one, ``DELETE`` releases one, and
``DELETE /v1/trajectories?job=`` drops every context of a job.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from heddle.exceptions import EngineInputError
from heddle.exceptions import RequestError as ApiError

from ._app_errors import error_responses
from ._app_state import (
    WorkerState,
    check_length,
    check_vocab,
    dropped,
    hold,
    refuse_when_unavailable,
    resident_context,
)
from ._chat import chat_delta
from ._drafts import DraftHistory
from ._engine import Engine, EngineError, Sampling, StepOutput
from ._schemas import (
    ExportResponse,
    FunctionCall,
    GenerateRequest,
    GenerateResponse,
    ImportRequest,
    ImportResponse,
    PurgeResponse,
    StepSpeculation,
    Timings,
    ToolCall,
)

__all__ = ["add_trajectory_routes"]

_WATCH_AFTER_S = 0.05
"""A step still running after this long starts watching for its client leaving."""

_INLINE_TOKENIZE_CHARS = 16_384
"""Messages shorter than this are tokenised in place (well under a millisecond): a
thread hop would cost more. Longer ones go to the tokenizer thread."""


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


async def _appended(state: WorkerState, body: GenerateRequest, held: list[int]) -> list[int]:
    engine = state.engine
    if body.append_token_ids is not None:
        check_vocab(engine, "append_token_ids", body.append_token_ids)
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


def _parsed(engine: Engine, body: GenerateRequest, text: str) -> dict[str, Any]:
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
    engine: Engine,
    request: Request,
    trajectory_id: str,
    context: list[int],
    sampling: Sampling,
    priority: int,
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


async def _generate(
    state: WorkerState,
    trajectory_id: str,
    body: GenerateRequest,
    request: Request,
    previous: list[int] | None,
) -> Response | None:
    """The step's answer, or ``None`` if the client went away before it finished."""
    engine, m = state.engine, state.metrics
    received = time.monotonic()
    held = [] if body.reset or previous is None else previous
    appended = await _appended(state, body, held)
    if body.reset and not appended:
        raise ApiError(422, "reset needs append_token_ids or messages to start from")
    if previous is None and not appended:
        resident_context(state, trajectory_id)  # raises 404
    if body.reset and previous is not None:
        engine.release(trajectory_id)
    context = [*held, *appended]
    check_length(engine, trajectory_id, len(context))
    sampling = body.sampling
    max_tokens = min(sampling.max_tokens, engine.max_model_len - len(context))
    if max_tokens < 1:
        raise ApiError(
            400,
            f"trajectory {trajectory_id!r} holds {len(context)} tokens: no room left to "
            f"generate within the model's max length {engine.max_model_len}",
        )
    if body.tool_parser is not None:
        _parsed(engine, body, "")  # a parser that does not fit the model fails before the step
    hold(state, trajectory_id, context)
    started = time.monotonic()
    output = await _step(
        engine,
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
        **_parsed(engine, body, text),
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


def add_trajectory_routes(app: FastAPI, state: WorkerState, drafts: DraftHistory) -> None:
    """The ``/v1/trajectories`` routes on ``app``; a job's purge drops its drafts too."""
    engine, m = state.engine, state.metrics

    @app.post(
        "/v1/trajectories/{trajectory_id}/generate",
        response_model=GenerateResponse,
        responses=error_responses(400, 404, 409, 413, 421, 422, 503),
    )
    async def generate(trajectory_id: str, body: GenerateRequest, request: Request) -> Response:
        refuse_when_unavailable(state)
        served = engine.weights.version if engine.weights else None
        if body.weight_version is not None and body.weight_version != served:
            raise ApiError(
                421,
                f"the worker serves weights version {served!r}, the step asks for "
                f"{body.weight_version!r}; load them with POST /v1/weights, then retry",
            )
        if trajectory_id in state.busy:
            raise ApiError(409, f"a step of trajectory {trajectory_id!r} is already running")
        check_vocab(engine, "sampling.stop_token_ids", body.sampling.stop_token_ids)
        state.busy.add(trajectory_id)  # from here: tokenising yields to other requests
        previous = state.contexts.get(trajectory_id)
        reply = None
        try:
            reply = await _generate(state, trajectory_id, body, request, previous)
        finally:
            state.busy.discard(trajectory_id)
            if reply is None:  # a step that did not finish leaves the context as it was
                if previous is None:
                    state.contexts.pop(trajectory_id)
                else:
                    hold(state, trajectory_id, previous)
        if reply is None:
            # The client went away: nobody reads this; 499 keeps it apart from failures.
            return JSONResponse({"error": "the client went away; step cancelled"}, 499)
        return reply

    @app.put(
        "/v1/trajectories/{trajectory_id}",
        response_model=ImportResponse,
        responses=error_responses(400, 409, 413, 422, 503),
    )
    async def import_context(trajectory_id: str, body: ImportRequest) -> ImportResponse:
        refuse_when_unavailable(state)
        if trajectory_id in state.busy:
            raise ApiError(
                409, f"a step of trajectory {trajectory_id!r} is running; import it later"
            )
        check_length(engine, trajectory_id, len(body.token_ids))
        check_vocab(engine, "token_ids", body.token_ids)
        context = list(body.token_ids)
        hold(state, trajectory_id, context)
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
        "/v1/trajectories/{trajectory_id}",
        response_model=ExportResponse,
        responses=error_responses(404),
    )
    async def export_context(trajectory_id: str) -> ExportResponse:
        context = resident_context(state, trajectory_id)
        m.exports.inc()
        return ExportResponse(trajectory_id=trajectory_id, token_ids=list(context))

    @app.delete(
        "/v1/trajectories/{trajectory_id}", status_code=204, responses=error_responses(404, 409)
    )
    async def release(trajectory_id: str) -> Response:
        resident_context(state, trajectory_id)
        if trajectory_id in state.busy:
            raise ApiError(
                409, f"a step of trajectory {trajectory_id!r} is running; release it later"
            )
        state.contexts.pop(trajectory_id)
        engine.release(trajectory_id)
        return Response(status_code=204)

    @app.delete("/v1/trajectories", response_model=PurgeResponse, responses=error_responses(422))
    async def purge(job: str) -> PurgeResponse:
        """Drop every resident context of ``job``: its session calls this when it starts
        (a predecessor's leftovers) and when it ends."""
        gone = state.contexts.purge(job, state.busy)
        dropped(state, gone, "purge")
        drafts.purge(job)
        return PurgeResponse(job=job, released=len(gone))
