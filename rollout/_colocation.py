"""Whether the live session keeps GRPO groups whole on one engine: the simulator's decision.

The simulator's Heddle runs decide it with
:func:`heddle.scheduler.sim.judge_colocation` (docs/speculation.md, "Group
co-location"); the live session asks the same function, with what it knows before
the run: the predictor's prior for the job's trajectories (rollout/_prior.py, the
sketch the shape planner simulates too), the pool's shape and routing (the shape
planner's fallback and in-flight cap, :class:`PoolPlan`), its performance model, and
its speculation as the simulator models it (the drafts feed seeds siblings and
history where the engines run suffix decoding). Where co-location is taken, the
session's placement becomes the simulator's group-keeping one
(:class:`~heddle.scheduler.sim.GroupStickyPlacement`: whole groups, a later step
spilled to the least loaded worker in the tail).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heddle.scheduler import (
    PerfModel,
    PoolShape,
    ProfiledPerfModel,
    SpeculationConfig,
    acceptance_model,
    get_policy,
)
from heddle.scheduler.sim import (
    GroupStickyPlacement,
    MiniRunner,
    SimConfig,
    SimSpeculation,
    heddle_speculation,
    judge_colocation,
    planner_cluster,
)
from heddle.worker import AUTO_ACCEPTANCE, Speculation

from ._drafts_feed import DRAFTING_METHODS
from ._job import LocalJob
from ._prior import prior_sketch

if TYPE_CHECKING:
    from ._session import RolloutSession

__all__ = ["ColocationVerdict", "apply_colocation", "live_colocation", "sim_speculation_for"]

log = logging.getLogger("heddle.run")

# The lengths a policy without a predictor is judged on: Heddle's own (its prior).
PRIOR_PREDICTOR = str(get_policy("heddle").predictor)


@dataclass(frozen=True)
class ColocationVerdict:
    """The decision and why (summary.json's ``colocation``). ``seed``: whether the drafts
    feed still inserts texts (False: groups kept whole ran faster without, in the
    decision's simulation; the feed then only keeps the history for later runs)."""

    colocate: bool
    reason: str
    seed: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"colocate": self.colocate, "reason": self.reason, "seed": self.seed}


def sim_speculation_for(speculation: Speculation) -> SimSpeculation | None:
    """The pool's speculation as the simulator models Heddle's: the method (``auto``:
    suffix, K by batch size), and siblings and history seeded where the engines draft
    from other texts (the drafts feed's methods). None: speculation off."""
    if not speculation.on:
        return None
    drafting = speculation.method in DRAFTING_METHODS
    method = "suffix" if drafting else speculation.method
    by_batch = speculation.method == "auto" or bool(speculation.by_batch_size)
    k = None if by_batch else speculation.num_speculative_tokens
    config = SpeculationConfig(method, k)
    if drafting:
        return heddle_speculation(config, acceptance_model(AUTO_ACCEPTANCE))
    return heddle_speculation(
        config, acceptance_model(AUTO_ACCEPTANCE), seed_siblings=False, seed_history=0
    )


def live_colocation(
    local: LocalJob,
    shape: PoolShape,
    routing: str,
    max_trajectories_in_flight: int | None,
    perf: PerfModel,
    speculation: Speculation | None = None,
    runner: MiniRunner | None = None,
) -> ColocationVerdict | None:
    """The decision for this run on ``shape`` under ``routing`` (the job's policy or the
    shape planner's fallback) at its in-flight cap (``PoolPlan``, rollout/_run.py), or
    None where it is not asked: speculation off, one sample per task (no groups), or a
    step-level baseline's policy (verl, slime: their own routing, as in the simulator);
    ``runner`` runs its simulations (default: inline)."""
    spec = sim_speculation_for(speculation or local.pool.speculation)
    if spec is None or local.job.samples_per_task <= 1:
        return None
    if not get_policy(local.job.policy).name.startswith("heddle"):
        # The simulator co-locates only for Heddle's runs (heddle bench: the baselines
        # run stock vLLM, whose routing places each trajectory); so does the session.
        return None
    predictor = get_policy(local.job.policy).predictor or PRIOR_PREDICTOR
    sketch = prior_sketch(local, predictor)
    sizes = tuple(sorted(set(local.pool.tensor_parallel_sizes) | set(shape.tps())))
    if isinstance(perf, ProfiledPerfModel):  # simulate only on what the profile measured
        sizes = tuple(tp for tp in sizes if tp in perf.profile.tps) or tuple(shape.tps())
    cluster = planner_cluster(perf, local.pool.gpus, local.pool.gpus_per_node, sizes)
    cap = max_trajectories_in_flight
    per_engine = max(1, cap // shape.num_instances) if cap else None
    placement, decision = judge_colocation(
        sketch.trajectories,
        sketch.records,
        cluster=cluster,
        policy=routing,
        shape=shape,
        perf=perf,
        config=SimConfig(max_trajectories_per_engine=per_engine, speculation=spec),
        tool_means_s=sketch.tool_means_s,
        predictor=predictor,
        runner=runner,
    )
    verdict = ColocationVerdict(placement is not None, decision.reason, decision.seed)
    log.info("%s: co-location of GRPO groups %s", local.job.name, decision.reason)
    return verdict


def apply_colocation(session: RolloutSession, verdict: ColocationVerdict | None) -> None:
    """Where co-location was taken, the session places a trajectory's first step where
    its group's first went and a later one where it ran, until that worker holds many
    more steps than the least loaded (the simulator's :class:`GroupStickyPlacement`); its
    drafts feed inserts nothing where the verdict says so (the simulator's run then
    seeds nothing either)."""
    if verdict is not None and verdict.colocate:
        session.placement = GroupStickyPlacement()
        if not verdict.seed and session.drafts is not None:
            session.drafts.inserting = False
