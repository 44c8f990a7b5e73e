"""What every part of a rollout session reads: configuration, job, policy, trajectories.

``RolloutSession`` (``_session.py``) is composed of parts, one concern each
(``_session_workers``, ``_session_output``, ``_session_weights``,
``_session_replan``, ``_session_progress``, ``_session_loop``). This module
holds what they share: ``SessionConfig``, ``SessionResult`` and ``SessionState``,
the state all parts read (the job and its sampling, the policy's parts, the
trajectories, the counts progress reports) with the two helpers every part
calls. Each part declares the state it owns; ``RolloutSession.__init__`` sets
it all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from heddle.api import REPLAN_INTERVAL_S, SamplingSpec
from heddle.scheduler import (
    FinishedTrajectory,
    LengthPredictor,
    MigrationPlanner,
    OrderingPolicy,
    PerfModel,
    PlacementPolicy,
    SchedulingPolicy,
)

from ._drafts_feed import DraftsFeed
from ._environments import Environment
from ._groups import GroupStream
from ._output import OutputSink
from ._progress import Progress, SessionMetrics, TokenRate
from ._record import TrajectoryRun
from ._tasks import Task
from ._weights import WeightsKeeper

__all__ = ["SessionConfig", "SessionResult", "SessionState", "log"]

log = logging.getLogger("heddle.session")


@dataclass(frozen=True)
class SessionConfig:
    """Knobs of the control loop; times in seconds."""

    replan_interval_s: float = REPLAN_INTERVAL_S  # placement re-plan and migration period
    step_timeout_s: float = 600.0  # one LLM step at most before the worker counts as silent
    health_interval_s: float = 1.0  # probe period of /readyz
    unhealthy_after: int = 3  # consecutive failed probes that mark a live worker down
    no_worker_timeout_s: float = 300.0  # give up when no worker is live for this long
    progress_interval_s: float = 1.0  # how often on_progress is called
    max_inflight_per_worker: int = 128  # requests in flight per worker; the rest queue here
    retry_backoff_s: float = 0.1  # first wait before a failed step is sent again; doubles
    retry_backoff_max_s: float = 10.0  # the longest wait between two attempts of one step
    max_step_retries: int = 8  # failures of one step on workers that stay ready, then it fails
    fail_fast_after: int = 8  # the first N finishes all rejected alike (4xx) stop the session


@dataclass
class SessionResult:
    progress: Progress
    migrations: int
    recomputes: int
    worker_failures: int
    steps: int
    deadline_hit: bool = False
    failures: list[str] = field(default_factory=list)  # first few failure reasons
    promotions: int = 0  # steps sent at a higher priority than the trajectory's previous step
    replans: int = 0  # placement plans redone during the run
    drafts: dict[str, int] | None = None  # the drafting corpus's traffic (DraftsFeed.stats)


class SessionState:
    """The state the session's parts share; ``RolloutSession.__init__`` sets it."""

    # The job.
    job: str
    tasks: list[Task]
    samples_per_task: int
    environment: Environment
    sink: OutputSink
    trace: OutputSink | None
    perf: PerfModel
    sampling: SamplingSpec
    max_turns: int
    deadline_s: float | None
    malformed_tasks: int
    config: SessionConfig
    metrics: SessionMetrics
    on_progress: Callable[[Progress], None] | None
    # The policy's parts.
    policy: SchedulingPolicy
    ordering: OrderingPolicy
    placement: PlacementPolicy
    migration: MigrationPlanner
    predictor: LengthPredictor | None
    # What several parts call on.
    weights: WeightsKeeper
    groups: GroupStream
    drafts: DraftsFeed | None
    # The trajectories, and what progress counts of them.
    runs: dict[str, TrajectoryRun]
    _history: Sequence[FinishedTrajectory]
    _started: float
    _rate: TokenRate
    _tokens: int
    _resumed: int
    _finished: dict[str, int]
    _children: dict[tuple[Counter, tuple[str, ...]], Counter]

    def _child(self, metric: Counter, *labels: str) -> Counter:
        child = self._children.get((metric, labels))
        if child is None:
            child = self._children[metric, labels] = metric.labels(*labels)
        return child

    def _predict(self, run: TrajectoryRun) -> None:
        if self.predictor is not None:
            self.predictor.update(run.traj)


def _prompt_estimate(messages: Sequence[Mapping[str, Any]]) -> int:
    """A prompt's tokens before it is tokenised: about four characters a token."""
    return max(1, sum(len(m.get("content") or "") // 4 for m in messages))
