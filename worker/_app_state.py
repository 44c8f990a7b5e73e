"""What one worker process holds besides the engine, and the checks routes make against it.

:class:`WorkerState`: resident contexts, the steps in flight, draining, the
weight load under way, the metrics. The functions below are the checks and
bookkeeping several routes share: whether steps may run now, whether a
context is resident, within the model's length and vocabulary, and keeping
a context resident under the cap and the TTL.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from heddle.exceptions import RequestError as ApiError

from ._app_errors import outside_vocabulary
from ._app_metrics import WorkerMetrics
from ._engine import Engine
from ._resident import ResidentContexts

__all__ = [
    "WorkerState",
    "check_length",
    "check_vocab",
    "dropped",
    "hold",
    "refuse_when_unavailable",
    "resident_context",
]


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
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics)
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


def dropped(state: WorkerState, gone: list[str], reason: str) -> None:
    """Contexts ``gone`` from the resident set (``reason``) go from the engine too."""
    for trajectory in gone:
        state.engine.release(trajectory)
    if gone:
        state.metrics.dropped.labels(reason).inc(len(gone))


def hold(state: WorkerState, trajectory_id: str, context: list[int]) -> None:
    """Keep ``context`` resident; what the cap or the TTL drops goes from the engine too."""
    before = dict(state.contexts.dropped)
    gone = state.contexts.put(trajectory_id, context, state.busy)
    after = state.contexts.dropped
    for reason in ("ttl", "cap"):
        if after[reason] > before[reason]:
            state.metrics.dropped.labels(reason).inc(after[reason] - before[reason])
    for trajectory in gone:
        state.engine.release(trajectory)


def resident_context(state: WorkerState, trajectory_id: str) -> list[int]:
    context = state.contexts.get(trajectory_id)
    if context is None:
        raise ApiError(
            404,
            f"trajectory {trajectory_id!r} is not resident on this worker; "
            "send its context with PUT /v1/trajectories/{id} or append tokens to start it",
        )
    return context


def check_length(engine: Engine, trajectory_id: str, tokens: int) -> None:
    if tokens > engine.max_model_len:
        raise ApiError(
            400,
            f"trajectory {trajectory_id!r} would hold {tokens} tokens, more than the "
            f"model's max length {engine.max_model_len}; end the trajectory or truncate it",
        )


def check_vocab(engine: Engine, where: str, token_ids: Sequence[int]) -> None:
    if not token_ids:
        return
    for bad in (min(token_ids), max(token_ids)):
        if not 0 <= bad < engine.vocab_size:
            raise ApiError(422, outside_vocabulary(where, bad, engine.vocab_size))


def refuse_when_unavailable(state: WorkerState) -> None:
    if state.draining:
        raise ApiError(503, "the worker is shutting down; send the step to another worker")
    if not state.engine.ready:
        raise ApiError(503, "the engine is not ready (loading, or failed); retry later")
    if state.loading is not None:
        raise ApiError(
            503,
            f"the worker is loading weights version {state.loading!r}; "
            "retry in a moment or on another worker",
        )
