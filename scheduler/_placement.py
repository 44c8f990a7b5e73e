"""Placement policies: which engine instance runs a trajectory's next step.

Heddle plans globally with the presorted DP (:mod:`._dp`) and keeps each
trajectory where its context is resident; moves happen only through the
migration planner. The step-centric baselines route each step by load, as
DESIGN.md describes slime, verl and verl*.
"""

from __future__ import annotations

import itertools
import zlib
from abc import ABC
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from heddle.exceptions import ConfigError

from ._dp import aggregate, solve_contiguous, split_contiguous
from ._perf import EngineInstance
from ._types import Trajectory

_EXACT_ORDERS_UP_TO = 5  # instances; more would mean too many DPs
_TIE_RATIO = 1.25  # predictions closer than 25% count as equal (the predictor errs more)

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

    def load_range(self) -> tuple[int, int]:
        """Smallest and largest load over the instances."""
        loads = [self.load.get(name, 0) for name in self.names()]
        return min(loads), max(loads)


@dataclass(frozen=True)
class PlacementPlan:
    """A global placement: predicted makespan and the instance of each trajectory."""

    makespan_s: float
    assignment: Mapping[str, str]


def _candidate_orders(instances: Sequence[EngineInstance]) -> list[list[EngineInstance]]:
    """Instance orders the DP tries.

    Some order's contiguous optimum is optimal over all assignments, and the
    order of identical instances does not matter. Up to five instances every
    distinct order is tried (exact). Beyond that, classes (same T, F, cap)
    stay together and up to three classes are permuted (at most six DPs);
    with more classes, fastest first only: the longest trajectories get the
    highest-TP engines, as in the paper.
    """
    classes: dict[tuple[float, int, tuple[float, ...]], list[EngineInstance]] = {}
    for inst in sorted(instances, key=lambda i: (i.per_token_s, i.name)):
        classes.setdefault((inst.per_token_s, inst.batch_cap, inst.slowdown), []).append(inst)
    groups = list(classes.values())
    if len(instances) <= _EXACT_ORDERS_UP_TO and len(groups) > 1:
        label = {id(inst): k for k, group in enumerate(groups) for inst in group}
        seen: set[tuple[int, ...]] = set()
        orders = []
        for perm in itertools.permutations(instances):
            key = tuple(label[id(i)] for i in perm)
            if key not in seen:
                seen.add(key)
                orders.append(list(perm))
        return orders
    if len(groups) > 3:
        return [[inst for group in groups for inst in group]]
    return [[inst for group in perm for inst in group] for perm in itertools.permutations(groups)]


def solve_lengths(
    lengths: Sequence[float] | np.ndarray,
    instances: Sequence[EngineInstance],
    *,
    exact_dp: bool = False,
) -> tuple[float, list[tuple[EngineInstance, np.ndarray]]]:
    """Best contiguous placement of bare lengths over the candidate instance orders;
    returns makespan and (instance, positions in ``lengths``).

    Each order is solved by the parametric search (:func:`._dp.split_contiguous`):
    the DP's optimum, with no table and no aggregation, so 16,384 trajectories on
    256 instances plan in milliseconds. ``exact_dp`` solves with the paper's DP
    instead (O(n · m · log n); the reference the tests and ``heddle bench
    placement`` compare against). Positions of each group are listed longest first.
    """
    arr = np.asarray(lengths, dtype=np.float64)
    if np.any(arr < 0) or not np.all(np.isfinite(arr)):
        raise ConfigError("predicted lengths must be finite and non-negative")
    order = np.argsort(-arr, kind="stable")
    ordered = arr[order]
    orders = _candidate_orders(instances)
    if exact_dp:
        items = aggregate(ordered, max(len(ordered), 2))
        solved = [solve_contiguous(items, candidate) for candidate in orders]
        k = min(range(len(orders)), key=lambda i: solved[i][0])
        makespan, ranges = solved[k]
    else:
        makespan, k, ranges = split_contiguous(ordered, orders)
    chosen = orders[k]
    groups = [(inst, order[start:end]) for inst, (start, end) in zip(chosen, ranges, strict=True)]
    return makespan, groups


def _stratify(
    trajectories: Sequence[Trajectory], groups: list[tuple[EngineInstance, np.ndarray]]
) -> dict[str, str]:
    """Deal near-ties across the DP's groups, one GRPO group after another (see plan_placement)."""
    n = len(trajectories)
    lengths = np.array([t.predicted_remaining_tokens for t in trajectories])
    ranked = np.argsort(-lengths, kind="stable")
    rank_of = np.empty(n, dtype=np.int64)
    rank_of[ranked] = np.arange(n)
    slot_owner = np.empty(n, dtype=np.int64)  # rank -> index of the group holding that slot
    for g, (_, positions) in enumerate(groups):
        slot_owner[rank_of[positions]] = g
    # Siblings consecutively (groups in a hashed order), so round-robin slots spread them.
    hashes: dict[str, int] = {}
    group_key = np.array(
        [hashes.setdefault(t.group_id, zlib.crc32(t.group_id.encode())) for t in trajectories]
    )
    deal_rank = np.empty(n, dtype=np.int64)
    deal_rank[np.lexsort((np.arange(n), group_key))] = np.arange(n)
    owner_of = np.empty(n, dtype=np.int64)  # trajectory index -> group index
    sorted_lengths = lengths[ranked]
    start = 0
    while start < n:
        end = int(np.searchsorted(-sorted_lengths, -sorted_lengths[start] / _TIE_RATIO, "right"))
        end = max(end, start + 1)
        owners = slot_owner[start:end]
        # Round-robin over the groups owning this window's slots: k-th slot of each in turn.
        by_owner = np.argsort(owners, kind="stable")
        first = np.searchsorted(owners[by_owner], owners[by_owner], "left")
        occurrence = np.empty(owners.size, dtype=np.int64)
        occurrence[by_owner] = np.arange(owners.size) - first
        slots = owners[np.lexsort((owners, occurrence))]
        window = ranked[start:end]
        dealt = window[np.argsort(deal_rank[window], kind="stable")]
        owner_of[dealt] = slots
        start = end
    names = [inst.name for inst, _ in groups]
    return {t.id: names[owner_of[i]] for i, t in enumerate(trajectories)}


def plan_placement(
    trajectories: Sequence[Trajectory],
    instances: Sequence[EngineInstance],
    *,
    exact_dp: bool = False,
) -> PlacementPlan:
    """Presorted-DP placement of live trajectories by predicted remaining length.

    The DP fixes how many trajectories each instance takes from each stretch
    of the sorted order; which of them goes where is then dealt among
    near-ties (predictions within 25% of the stretch's longest, well inside
    the predictor's error) round-robin over the instances, one group's
    samples after another, so each group is spread evenly. Without that,
    GRPO siblings, which share one prediction before they have run, sit side
    by side in the sort and land on one engine together; their true lengths
    are correlated, so the hedge against the prediction's error is to
    stratify them. Each group's longest member moves by at most 25%.
    """
    if not trajectories:
        return PlacementPlan(0.0, {})
    lengths = [t.predicted_remaining_tokens for t in trajectories]
    makespan, groups = solve_lengths(lengths, instances, exact_dp=exact_dp)
    return PlacementPlan(makespan, _stratify(trajectories, groups))


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
    and re-prefills its whole context; a tie keeps it where it was.
    """

    name = "least-load"

    def route(self, trajectory: Trajectory, view: ClusterView) -> str:
        # A router sends a tie to where the context already is (no re-prefill for nothing).
        best = view.least_loaded()
        current = trajectory.instance
        if view.has(current) and view.load.get(current or "", 0) <= view.load.get(best, 0):
            assert current is not None
            return current
        return best


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
        lowest, highest = view.load_range()
        if highest / max(lowest, 1) > self.max_load_ratio:
            return view.least_loaded()
        return super().route(trajectory, view)


class DPPlacement(StickyPlacement):
    """Heddle: presorted-DP global plan; a trajectory stays where its context lives.

    New trajectories go where the plan puts them (least loaded until the first
    plan exists); moving a running trajectory to its planned instance is the
    migration planner's decision, taken only during a tool call. One escape
    hatch beyond the paper: a step whose engine holds more than
    ``rebalance_margin`` requests more than the least-loaded engine goes
    there and recomputes its context, since waiting behind that queue costs
    more (``None`` turns this off; in the simulator it shortens math rollouts
    by a quarter and leaves coding and search unchanged).
    """

    name = "presorted-dp"

    def __init__(self, rebalance_margin: int | None = 32) -> None:
        self.rebalance_margin = rebalance_margin
        self._plan: PlacementPlan = PlacementPlan(0.0, {})

    def route(self, trajectory: Trajectory, view: ClusterView) -> str:
        here = trajectory.instance
        if self.rebalance_margin is not None and here is not None and view.has(here):
            best = view.least_loaded()
            if view.load.get(here, 0) - view.load.get(best, 0) > self.rebalance_margin:
                return best
        return super().route(trajectory, view)

    @property
    def plan(self) -> PlacementPlan:
        return self._plan

    def replan(self, trajectories: Sequence[Trajectory], view: ClusterView) -> None:
        self.adopt(plan_placement(trajectories, view.instances))

    def adopt(self, plan: PlacementPlan) -> None:
        """Make ``plan`` the current one (a simulator adopts a plan once its CPU time passed)."""
        self._plan = plan

    def target(self, trajectory: Trajectory) -> str | None:
        return self._plan.assignment.get(trajectory.id)

    def first_step(self, trajectory: Trajectory, view: ClusterView) -> str:
        planned = self.target(trajectory)
        return planned if view.has(planned) and planned is not None else view.least_loaded()
