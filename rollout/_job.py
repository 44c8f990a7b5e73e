"""A RolloutJob resolved for a run: its spec, its pool, its tasks and where it writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from heddle.api import EnginePoolSpec, RolloutJobSpec
from heddle.scheduler import FinishedTrajectory, WorkloadSpec

from ._hosts import HostAllowList
from ._tasks import TaskSet

__all__ = ["LocalJob"]


@dataclass
class LocalJob:
    job: RolloutJobSpec
    pool: EnginePoolSpec
    tasks: TaskSet
    workload: WorkloadSpec | None
    output: Path
    base_dir: Path
    tool_hosts: HostAllowList = field(default_factory=HostAllowList)  # where tools may go
    # The pool's previous rollout (rollout/_previous.py): seeds the predictor, and is what
    # the shape and co-location decisions simulate; empty: the predictor's prior.
    history: tuple[FinishedTrajectory, ...] = ()
