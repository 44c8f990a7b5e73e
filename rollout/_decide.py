"""Taking a session's start-up decisions: now, or ahead for the next iteration.

:func:`decide_run` decides the pool's shape and routing (:func:`plan_pool`) and whether
GRPO groups stay whole (``live_colocation``) by mini-simulations of what the session
expects of the job (rollout/_prior.py), unless decisions kept under the same key are
found (rollout/_decided.py). :func:`announce_next` and :meth:`NextDecisions.take` take
the next iteration's decisions once a rollout has ended, on that rollout as the next
session will read it: in a trainer's in-process loop in a background thread
(:func:`decide_ahead`), in a session pod after its job's final status. The next session
with that key finds them kept, or waits for the rest (announced in the cache, so also
from another process), instead of deciding the same again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from heddle.scheduler import PerfModel, PoolShape, ProfiledPerfModel, ShapeConfig, get_policy
from heddle.scheduler.sim import MiniRunner, SimulatedShapePlanner
from heddle.worker import Speculation

from ._colocation import live_colocation, sim_speculation_for
from ._decided import (
    DecidedRun,
    DecisionCache,
    PoolPlan,
    decision_key,
    mean_prompt_tokens,
    prompts_match,
)
from ._decisions import ProcessRunner
from ._job import LocalJob
from ._prior import prior_sketch

__all__ = ["NextDecisions", "announce_next", "decide_ahead", "decide_run", "plan_pool"]

log = logging.getLogger("heddle.run")

# How long the next session is told to wait for decisions taken ahead, from what this
# iteration's took: twice that and half a minute (the next may find the CPUs busier).
AHEAD_SLACK = 2.0
AHEAD_SLACK_S = 30.0


def plan_pool(
    local: LocalJob,
    perf: PerfModel,
    speculation: Speculation | None = None,
    runner: MiniRunner | None = None,
) -> PoolPlan:
    """A pinned shape as given; otherwise planned from the predictor's prior (no history).

    The same planner as the simulator's (:class:`SimulatedShapePlanner`): each
    candidate shape is scored by a scaled-down simulation of the predicted
    trajectories (their lengths and turns from the predictor's prior; tool
    latency and reply length from the synthetic workload when there is one),
    so the KV cache, recompute, the batch cap and tool time count, with the
    pool's speculation (``speculation`` overrides it, as in :func:`live_colocation`);
    ``runner`` runs its simulations (default: inline; :class:`ProcessRunner`: on
    worker processes).
    """
    pool = local.pool
    if pool.shape is not None:
        return PoolPlan(pool.shape, local.job.policy)
    sizes = pool.tensor_parallel_sizes
    if isinstance(perf, ProfiledPerfModel):  # plan only on what the profile measured
        sizes = tuple(tp for tp in sizes if tp in perf.profile.tps)
    smallest = min(sizes)
    baseline = PoolShape.of({smallest: pool.gpus // smallest})
    policy = get_policy(local.job.policy)
    if not policy.adaptive_shape or policy.predictor is None:
        return PoolPlan(baseline, local.job.policy)
    sketch = prior_sketch(local, policy.predictor)
    config = ShapeConfig(
        gpu_budget=pool.gpus,
        gpus_per_node=pool.gpus_per_node,
        tensor_parallel_sizes=sizes,
    )
    # No running shape to weigh a reshape against: the pool takes the plan (the
    # operator reshapes to it), and its fallback and cap were scored on that shape.
    spec = sim_speculation_for(speculation or pool.speculation)
    planner = SimulatedShapePlanner(perf, config, speculation=spec, runner=runner)
    plan = planner.plan_history(
        sketch.records,
        None,
        tool_means_s=sketch.tool_means_s,
        tool_output_tokens=sketch.tool_output_tokens,
        policy=policy.name,
    )
    if plan.fallback_policy is None:
        return PoolPlan(plan.shape, local.job.policy)
    cap = plan.max_trajectories_per_engine
    return PoolPlan(
        plan.shape, plan.fallback_policy, cap * plan.shape.num_instances if cap else None
    )


@dataclass(frozen=True)
class NextDecisions:
    """The next iteration's decisions, announced under ``key`` in ``cache`` and taken by
    :meth:`take` (:func:`announce_next`)."""

    local: LocalJob  # the job as the next iteration reads it: this rollout its history
    perf: PerfModel
    speculation: Speculation | None
    cache: DecisionCache
    key: str

    def take(self) -> DecidedRun:
        """Decide and keep them (none kept under the key yet), then take the word back."""
        try:
            kept = self.cache.get(self.key, self.local)  # the same inputs decided before
            if kept is not None and prompts_match(kept, self.local):
                return kept
            return _decide(self.local, self.perf, self.speculation, self.key, self.cache)
        finally:
            self.withdraw()

    def withdraw(self) -> None:
        """Take the word back (they are kept now, or will not be: nobody waits for them)."""
        self.cache.settle(self.key)


def announce_next(
    local: LocalJob,
    perf: PerfModel,
    speculation: Speculation | None,
    cache: DecisionCache,
    decided_s: float,
) -> NextDecisions:
    """Announce in ``cache`` that the next iteration of ``local``'s job (the same
    template on ``local.history``) has its decisions taken: a session with that key,
    in any process that reads ``cache``'s folder, waits for them rather than decide the
    same (at most :data:`AHEAD_SLACK` times ``decided_s``, this iteration's deciding,
    and :data:`AHEAD_SLACK_S` more). Call :meth:`NextDecisions.take` next."""
    key = decision_key(local, perf, speculation)
    cache.announce(key, AHEAD_SLACK * decided_s + AHEAD_SLACK_S)
    return NextDecisions(local, perf, speculation, cache, key)


# Decisions being taken ahead in this process, by key (:func:`decide_ahead`).
_AHEAD: dict[str, Future[DecidedRun]] = {}
_AHEAD_THREAD = ThreadPoolExecutor(1, thread_name_prefix="heddle-decide-ahead")


def decide_ahead(
    local: LocalJob,
    perf: PerfModel,
    speculation: Speculation | None,
    cache: DecisionCache,
    decided_s: float = 0.0,
) -> Future[DecidedRun]:
    """Take, in the background, the decisions of the next iteration of ``local``'s job
    (:func:`announce_next`). A :func:`decide_run` in this process with that key waits for
    it instead of deciding again; the trainer trains meanwhile (docs/speculation.md)."""
    ahead = announce_next(local, perf, speculation, cache, decided_s)
    future = _AHEAD_THREAD.submit(ahead.take)
    _AHEAD[ahead.key] = future
    return future


def decide_run(
    local: LocalJob,
    perf: PerfModel,
    speculation: Speculation | None = None,
    *,
    earlier: DecidedRun | None = None,
    cache: DecisionCache | None = None,
) -> DecidedRun:
    """The run's shape and routing (:func:`plan_pool`), whether it keeps GRPO groups whole
    (:func:`live_colocation`), and the seconds deciding took: each decision's
    simulations side by side on worker processes (:class:`ProcessRunner`). Blocking;
    the session pod calls it off its loop.

    Taken instead from ``earlier`` (the pool's last record, already checked) or from
    ``cache`` where one was kept under the same :func:`decision_key`: the same inputs
    give the same decisions, so an iteration of a job decided before starts at once
    (rollout/_decided.py). Where they are being taken ahead (:func:`announce_next`, in
    this process or announced in ``cache``), it waits for them. What is decided here is
    kept in ``cache``.
    """
    key = decision_key(local, perf, speculation)
    found = earlier if earlier is not None and earlier.key == key else None
    waited = 0.0
    if found is None and cache is not None:
        ahead = _AHEAD.pop(key, None)
        if ahead is not None:  # decided ahead by the previous run in this process
            started = time.perf_counter()
            with contextlib.suppress(Exception):  # it failed: decided here instead
                ahead.result()
            waited = time.perf_counter() - started
        else:  # announced by another process (a session pod's, for its pool's next job)
            waited = cache.wait(key)
        found = cache.get(key, local)
    if found is not None and not prompts_match(found, local):
        log.info("%s: decisions kept under this key were taken on prompts of %.0f tokens "
                 "(these: %.0f); deciding afresh", local.job.name, found.prompt_mean_tokens,
                 mean_prompt_tokens(local))  # fmt: skip
        found = None
    if found is not None:
        log.info("%s: shape %s and co-location reused from an earlier run with the same "
                 "inputs (deciding took %.1f s then; waited %.1f s for it)", local.job.name,
                 found.plan.shape, found.decided_s, waited)  # fmt: skip
        return replace(found, reused=True, waited_s=waited)
    decided = _decide(local, perf, speculation, key, cache)
    return replace(decided, waited_s=waited) if waited else decided


def _decide(
    local: LocalJob,
    perf: PerfModel,
    speculation: Speculation | None,
    key: str,
    cache: DecisionCache | None,
) -> DecidedRun:
    """Decide by simulating (:func:`decide_run` found none kept), and keep the answer."""
    started = time.perf_counter()
    with ProcessRunner() as runner:
        plan = plan_pool(local, perf, speculation, runner)
        colocation = live_colocation(
            local, plan.shape, plan.policy, plan.max_trajectories_in_flight, perf,
            speculation, runner,
        )  # fmt: skip
    took = time.perf_counter() - started
    on = f"{runner.used} worker processes" if runner.used > 1 else "the session's process"
    log.info("%s: shape %s and co-location decided in %.1f s (on %s)", local.job.name,
             plan.shape, took, on)  # fmt: skip
    decided = DecidedRun(key, plan, colocation, took, mean_prompt_tokens(local))
    if cache is not None:
        cache.put(decided)
    return decided
