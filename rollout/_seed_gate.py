"""Whether a text the drafts feed holds is worth inserting into an engine's suffix cache.

The simulator decides every insertion with :func:`heddle.scheduler.seed_text_pays`
(scheduler/sim/_speculation.py); the live feed (rollout/_drafts_feed.py) asks the
same function here, with the same inputs read from what the session knows:

* the engine: its TP and K from its ``/v1/state`` (K from its batch-size table at
  the batch it runs now, as its engine picks it), its batch and the context it
  holds from the session's trajectories generating there;
* the group there: the predictor's remaining tokens of the task's trajectories
  generating on the engine, and how many siblings' texts the engine holds (those
  that ran a step there, and those already inserted);
* the acceptance before and after: the acceptance model a worker's ``auto`` K
  table is built on (:data:`heddle.worker.AUTO_ACCEPTANCE`) at the output's start,
  the simulator's question exactly.

A sibling's texts are decided together the first time they would reach an engine
(the simulator's "its whole text so far"); once inserted, its later turns follow
without asking (kept current, as the simulator charges them). The history of a task
is decided once per engine.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from heddle.scheduler import (
    ACCEPTANCE_PRESETS,
    SEED_S_PER_TOKEN,
    AcceptanceModel,
    PerfModel,
    SeedQuery,
    Trajectory,
    TrajectoryState,
    seed_text_pays,
)
from heddle.worker import AUTO_ACCEPTANCE, DEFAULT_SPECULATIVE_TOKENS

__all__ = ["SeedDecision", "SeedGate", "engine_k"]


def engine_k(speculation: Mapping[str, Any] | None, batch: int) -> int:
    """The K an engine drafts with at ``batch`` running sequences, from its
    ``/v1/state.speculation`` (``by_batch_size``: ``[first, last, K]`` rows; beyond the
    last row the last K, as the worker's table reads)."""
    if not speculation:
        return 0
    table = speculation.get("by_batch_size") or []
    for first, last, k in table:
        if first <= batch <= last:
            return int(k)
    if table:
        return int(table[-1][2])
    return int(speculation.get("num_speculative_tokens") or DEFAULT_SPECULATIVE_TOKENS)


@dataclass(frozen=True)
class SeedDecision:
    """One decision, for the counts and the tests: ``unit`` is the sibling's trajectory
    id, or ``history``."""

    engine: str
    task_id: str
    unit: str
    texts: int
    query: SeedQuery
    pays: bool


@dataclass
class SeedGate:
    """Asks :func:`seed_text_pays` for the live feed (module docstring)."""

    perf: PerfModel
    acceptance: AcceptanceModel = field(default_factory=lambda: ACCEPTANCE_PRESETS[AUTO_ACCEPTANCE])
    seconds_per_inserted_token: float = SEED_S_PER_TOKEN
    # The newest decisions, for reports and tests (bounded: a long run takes many).
    decisions: deque[SeedDecision] = field(default_factory=lambda: deque(maxlen=10_000))

    def tokens_per_step(self, k: int, siblings: int, history: float) -> float:
        """The acceptance the simulator's decision reads: suffix drafting at the output's
        start."""
        return self.acceptance.tokens_per_step(
            "suffix", k, siblings=siblings, history=history, position=0.0
        )

    def query(
        self,
        running: list[tuple[str, Trajectory]],
        *,
        task_group: str,
        tp: int,
        speculation: Mapping[str, Any] | None,
        insert_tokens: float,
        siblings_held: int,
        siblings_after: int,
        history_held: int = 0,
        history_after: int = 0,
        history_unseeded: float = 0.0,
    ) -> SeedQuery:
        """The question for one engine: ``running`` is ``(group, trajectory)`` of each
        request generating there now."""
        live = [t for _, t in running if t.state == TrajectoryState.GENERATING]
        members = [
            t for g, t in running if g == task_group and t.state == TrajectoryState.GENERATING
        ]
        return SeedQuery(
            tp=tp,
            batch=len(live),
            context_tokens=float(sum(max(t.context_tokens, t.prompt_tokens) for t in live)),
            k=engine_k(speculation, len(live)),
            insert_tokens=insert_tokens,
            members=len(members),
            remaining_tokens=sum(max(0.0, t.predicted_remaining_tokens) for t in members),
            siblings_held=siblings_held,
            siblings_after=siblings_after,
            history_held=history_held,
            history_after=history_after,
            history_unseeded=history_unseeded,
        )

    def decide(self, engine: str, task_id: str, unit: str, texts: int, query: SeedQuery) -> bool:
        pays = seed_text_pays(
            self.perf,
            query,
            self.tokens_per_step,
            seconds_per_inserted_token=self.seconds_per_inserted_token,
        )
        self.decisions.append(SeedDecision(engine, task_id, unit, texts, query, pays))
        return pays
