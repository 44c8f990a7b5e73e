"""What the session expects of a job before it runs: the pool's previous rollout, or
the predictor's prior as records where there is none.

The shape planner (rollout/_run.py, ``plan_pool``) and the co-location decision
(rollout/_colocation.py) both simulate this sketch, as the simulator's Heddle runs do:
on the previous rollout's records with the trajectories predicted by a predictor seeded
with them, or on the prior's predictions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from heddle.scheduler import (
    Distribution,
    FinishedTrajectory,
    PredictorConfig,
    Trajectory,
    make_predictor,
)

from ._job import LocalJob
from ._tasks import Task

__all__ = ["PriorSketch", "prior_sketch", "prompt_tokens"]


@dataclass(frozen=True)
class PriorSketch:
    """The job's trajectories as the predictor's prior sees them: ``records`` (bounded by
    the job's own limits) and ``trajectories`` (with their predicted remaining lengths;
    ``group_id`` the task); the tools' mean latency and reply length from the synthetic
    workload when there is one."""

    records: list[FinishedTrajectory]
    trajectories: list[Trajectory]
    tool_means_s: dict[str, float] = field(default_factory=dict)
    tool_output_tokens: float = 128.0


def prior_sketch(local: LocalJob, predictor: str) -> PriorSketch:
    """The job's trajectories as ``predictor`` expects them before the run: seeded with the
    pool's previous rollout where there is one (``local.history``, whose records are then
    what the decisions simulate, as the simulator's runs do), else from its prior."""
    model = make_predictor(
        predictor, PredictorConfig.for_budget(local.job.sampling.max_total_tokens)
    )
    if local.history:
        model.seed(local.history)
    records: list[FinishedTrajectory] = []
    trajectories: list[Trajectory] = []
    for i, task in enumerate(local.tasks.tasks):
        prompt = prompt_tokens(task)
        for s in range(local.job.samples_per_task):
            t = Trajectory(f"t{i}-{s}", f"t{i}", prompt)
            prediction = model.update(t)
            # The job's own limits bound what the prior predicts: a trajectory never
            # generates more than maxTotalTokens nor runs more than maxTurns steps.
            tokens = min(prediction.remaining_tokens, local.job.sampling.max_total_tokens)
            turns = min(prediction.remaining_turns, local.job.max_turns)
            t.predicted_remaining_tokens = tokens
            t.predicted_remaining_turns = turns
            trajectories.append(t)
            records.append(FinishedTrajectory.predicted(t))
    if local.history:
        records = list(local.history)
    tool_means: dict[str, float] = {}
    reply_tokens = 128.0
    if local.workload is not None and local.workload.tools:
        tools = local.workload.tools
        tool_means = {t.name: _dist_mean(t.latency_s) for t in tools}
        reply_tokens = float(sum(_dist_mean(t.output_tokens) for t in tools) / len(tools))
    return PriorSketch(records, trajectories, tool_means, reply_tokens)


def prompt_tokens(task: Task) -> int:
    """A task's prompt in tokens as the sketch counts it (about four characters each)."""
    return max(1, sum(len(m["content"]) // 4 for m in task.messages))


def _dist_mean(d: Distribution) -> float:
    """Mean of a clipped log-normal, approximately (the unclipped mean, clipped)."""
    return float(min(max(d.median * math.exp(0.5 * d.sigma**2), d.minimum), d.maximum))
