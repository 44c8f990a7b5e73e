"""Placement policies: which engine instance runs a trajectory's next step.

Heddle plans globally with the presorted DP (:mod:`._dp`) and keeps each
trajectory where its context is resident; moves happen only through the
migration planner. The step-centric baselines route each step by load, as
DESIGN.md describes slime, verl and verl*.
"""

from __future__ import annotations

import itertools
from abc import ABC
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from heddle.exceptions import ConfigError

from ._dp import aggregate, solve_contiguous
from ._perf import EngineInstance
from ._types import Trajectory

__all__ = [
    "ClusterView",
    "DPPlacement",
    "LeastLoadPlacement",
    "PlacementPlan",
    "PlacementPolicy",
    "RoundRobinPlacement",
    "StickyPlacement",
    "ThresholdStickyPlacement",
    "plan_placement",
    "solve_lengths",
]


@dataclass(frozen=True)
class ClusterView:
    """What a placement policy may look at: the live instances and their load.

    ``load`` counts the trajectories resident on or queued at each instance.
    """

    instances: Sequence[EngineInstance]
    load: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.instances:
            raise ConfigError("no engine instances are ready; placement needs at least one")

    def names(self) -> list[str]:
        return [i.name for i in self.instances]

    def least_loaded(self) -> str:
        """Instance with the fewest trajectories; ties go to the earliest listed."""
        return min(self.instances, key=lambda i: self.load.get(i.name, 0)).name

    def has(self, name: str | None) -> bool:
        return name is not None and any(i.name == name for i in self.instances)


@dataclass(frozen=True)
class PlacementPlan:
    """A global placement: predicted makespan and the instance of each trajectory."""

    makespan_s: float
    assignment: Mapping[str, str]


def _candidate_orders(instances: Sequence[EngineInstance]) -> list[list[EngineInstance]]:
    """Instance orders the DP tries: classes (same T, F, cap) kept together.

    The order of identical instances does not matter, so a homogeneous pool
    needs one DP, and with every class order tried the result is optimal over
    all assignments whenever no optimum interleaves classes (always, for up
    to three instances). Up to three classes are permuted (at most six DPs);
    beyond that, fastest first only: the longest trajectories get the
    highest-TP engines, as in the paper.
    """
    classes: dict[tuple[float, int, tuple[float, ...]], list[EngineInstance]] = {}
    for inst in sorted(instances, key=lambda i: (i.per_token_s, i.name)):
        classes.setdefault((inst.per_token_s, inst.batch_cap, inst.slowdown), []).append(inst)
    groups = list(classes.values())
    if len(groups) > 3:
        return [[inst for group in groups for inst in group]]
    return [[inst for group in perm for inst in group] for perm in itertools.permutations(groups)]


def solve_lengths(
    lengths: Sequence[float] | np.ndarray,
    instances: Sequence[EngineInstance],
    *,
    max_items: int = 1024,
) -> tuple[float, list[tuple[EngineInstance, np.ndarray]]]:
    """Best DP placement of bare lengths; returns makespan and (instance, sorted positions).

    Positions index ``lengths`` sorted in descending order (stable).
    """
    arr = np.asarray(lengths, dtype=np.float64)
    if np.any(arr < 0) or not np.all(np.isfinite(arr)):
        raise ConfigError("predicted lengths must be finite and non-negative")
    order = np.argsort(-arr, kind="stable")
    items = aggregate(arr[order], max_items)
    best: tuple[float, list[EngineInstance], list[tuple[int, int]]] | None = None
    for candidate in _candidate_orders(instances):
        makespan, ranges = solve_contiguous(items, candidate)
        if best is None or makespan < best[0]:
            best = (makespan, candidate, ranges)
    assert best is not None
    makespan, chosen, ranges = best
    members = items.members
    groups = [
        (inst, order[members[start] : members[end]])
        for inst, (start, end) in zip(chosen, ranges, strict=True)
    ]
    return makespan, groups


def plan_placement(
    trajectories: Sequence[Trajectory],
    instances: Sequence[EngineInstance],
    *,
    max_items: int = 1024,
) -> PlacementPlan:
    """Presorted-DP placement of live trajectories by predicted remaining length."""
    if not trajectories:
        return PlacementPlan(0.0, {})
    lengths = [t.predicted_remaining_tokens for t in trajectories]
    makespan, groups = solve_lengths(lengths, instances, max_items=max_items)
    assignment = {
        trajectories[int(pos)].id: inst.name for inst, positions in groups for pos in positions
    }
    return PlacementPlan(makespan, assignment)


class PlacementPolicy(ABC):
    """Chooses the instance for a trajectory's next step.

    ``route`` is called whenever a step becomes ready; ``replan`` whenever
    predictions changed enough to redo the global plan (a no-op for the
    step-centric baselines); ``target`` says where the plan wants a
    trajectory, which the migration planner acts on.
    """

    name: ClassVar[str]

    def route(self, trajectory: Trajectory, view: ClusterView) -> str:
        """Instance name for the trajectory's next step."""
        return view.least_loaded()

    def replan(self, trajectories: Sequence[Trajectory], view: ClusterView) -> None:
        """Recompute the global plan (optional)."""
        return None

    def target(self, trajectory: Trajectory) -> str | None:
        """Where the current plan places the trajectory, if there is a plan."""
        return None


class LeastLoadPlacement(PlacementPolicy):
    """slime: every step goes to the least-loaded engine, wherever the context lives.

    A step that lands elsewhere than its previous one loses the prefix cache
    and re-prefills its whole context.
    """

    name = "least-load"


class StickyPlacement(PlacementPolicy):
    """verl: cache-aware; a trajectory stays on the engine of its first step.

    The first step goes to the engine with the fewest requests (verl's
    least-requests balancer); later steps follow it there.
    """

    name = "sticky"

    def route(self, trajectory: Trajectory, view: ClusterView) -> str:
        if view.has(trajectory.instance):
            assert trajectory.instance is not None
            return trajectory.instance
        return self.first_step(trajectory, view)

    def first_step(self, trajectory: Trajectory, view: ClusterView) -> str:
        return view.least_loaded()


class RoundRobinPlacement(StickyPlacement):
    """FCFS baseline: first steps dealt round-robin, then sticky."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def first_step(self, trajectory: Trajectory, view: ClusterView) -> str:
        names = view.names()
        choice = names[self._next % len(names)]
        self._next += 1
        return choice


class ThresholdStickyPlacement(StickyPlacement):
    """verl*: sticky like verl, but least-load once max/min engine load exceeds a ratio.

    An idle engine counts as load 1, so the ratio stays finite.
    """

    name = "sticky-threshold"

    def __init__(self, max_load_ratio: float = 32.0) -> None:
        if max_load_ratio <= 1.0:
            raise ConfigError(f"max_load_ratio={max_load_ratio} must exceed 1.0 (paper: 32)")
        self.max_load_ratio = max_load_ratio

    def route(self, trajectory: Trajectory, view: ClusterView) -> str:
        loads = [view.load.get(name, 0) for name in view.names()]
        if max(loads) / max(min(loads), 1) > self.max_load_ratio:
            return view.least_loaded()
        return super().route(trajectory, view)


class DPPlacement(StickyPlacement):
    """Heddle: presorted-DP global plan; a trajectory stays where its context lives.

    New trajectories go where the plan puts them (least loaded until the first
    plan exists); moving a running trajectory to its planned instance is the
    migration planner's decision, taken only during a tool call.
    """

    name = "presorted-dp"

    def __init__(self, max_items: int = 1024) -> None:
        self.max_items = max_items
        self._plan: PlacementPlan = PlacementPlan(0.0, {})

    @property
    def plan(self) -> PlacementPlan:
        return self._plan

    def replan(self, trajectories: Sequence[Trajectory], view: ClusterView) -> None:
        self._plan = plan_placement(trajectories, view.instances, max_items=self.max_items)

    def target(self, trajectory: Trajectory) -> str | None:
        return self._plan.assignment.get(trajectory.id)

    def first_step(self, trajectory: Trajectory, view: ClusterView) -> str:
        planned = self.target(trajectory)
        return planned if view.has(planned) and planned is not None else view.least_loaded()
