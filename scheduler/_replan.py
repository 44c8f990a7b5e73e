"""The re-plan step: one decision, taken by the live session and by the simulator.

Every re-plan period the session (``heddle.rollout``) and the simulator
(:mod:`.sim`) ask the same question: given the unfinished trajectories, the
serving engines with their load, and the engines being drained, what is the
new placement plan and which trajectories move now? Both map their own state
onto a :class:`ReplanState` and call :func:`decide_replan`; neither writes the
rule again, so a simulated figure is a claim about the code that ships.

What a caller keeps: when the step runs (a timer in the session, an event in
the simulator) and how a move is carried out (an HTTP import with ``warm``, or
a simulated prefill). The simulator also charges the planner's CPU time: it
asks for a *deferred* plan, adopted when the planner returns
(:meth:`.DPPlacement.adopt`); the session adopts at once, its CPU time being
real.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from ._migration import MigrationPlanner, Move
from ._perf import EngineInstance
from ._placement import ClusterView, DPPlacement, PlacementPlan, PlacementPolicy, plan_placement
from ._types import Trajectory

__all__ = ["DrainingEngine", "ReplanDecision", "ReplanState", "decide_replan"]


@dataclass(frozen=True)
class DrainingEngine:
    """An engine being removed: its trajectories leave during tool calls, whatever the gain."""

    instance: EngineInstance
    load: int  # trajectories resident on or queued at it


@dataclass(frozen=True)
class ReplanState:
    """What a re-plan looks at; times in seconds since the rollout started.

    ``live`` are the unfinished trajectories the plan covers. ``movable`` are
    those a move may take now: not already moving, their context resident on
    the engine their ``instance`` names (the migration planner further keeps
    only those in a tool call). ``busy`` names engines sending or receiving a
    move in flight.
    """

    live: Sequence[Trajectory]
    movable: Sequence[Trajectory]
    view: ClusterView
    now_s: float
    draining: Mapping[str, DrainingEngine] = field(default_factory=dict)
    busy: Collection[str] = frozenset()


@dataclass(frozen=True)
class ReplanDecision:
    """The moves to start, and a plan still to adopt (only when the caller deferred it)."""

    moves: tuple[Move, ...]
    deferred_plan: PlacementPlan | None = None


def decide_replan(
    state: ReplanState,
    placement: PlacementPolicy,
    migration: MigrationPlanner,
    *,
    defer: bool = False,
) -> ReplanDecision:
    """Redo the placement plan over ``state.live`` and plan the moves towards it.

    With ``defer`` a :class:`.DPPlacement` computes its plan without adopting
    it (the moves aim at the new plan; the caller adopts it later); other
    policies re-plan in place. A policy without a plan proposes no moves but
    those off draining engines.
    """
    if not state.live:
        return ReplanDecision(())
    deferred: PlacementPlan | None = None
    target: Callable[[Trajectory], str | None] = placement.target
    if defer and isinstance(placement, DPPlacement):
        new_plan = deferred = plan_placement(state.live, state.view.instances)
        target = lambda t: new_plan.assignment.get(t.id)  # noqa: E731
    else:
        placement.replan(state.live, state.view)
    instances = {i.name: i for i in state.view.instances}
    load: Mapping[str, int] = state.view.load
    if state.draining:  # sources of moves (everything must leave them), never targets
        instances.update((n, d.instance) for n, d in state.draining.items())
        load = {**state.view.load, **{n: d.load for n, d in state.draining.items()}}
    moves = migration.plan(
        state.movable,
        target,
        instances,
        load,
        state.now_s,
        busy=state.busy,
        draining=state.draining.keys(),
    )
    return ReplanDecision(tuple(moves), deferred)
