"""Scheduling policies by name: Heddle, its ablations, and the step-centric baselines.

A policy names one component of each kind; each component is a small object
built from its own registry. ``scheduling.policy`` in a RolloutJob and
``heddle bench --policies`` take these names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from heddle.exceptions import ConfigError

from ._migration import MigrationConfig, MigrationPlanner, NoMigration, ToolWindowMigration
from ._ordering import FCFSOrdering, OrderingPolicy, ProgressivePriority
from ._perf import PerfModel
from ._placement import (
    DPPlacement,
    LeastLoadPlacement,
    PlacementPolicy,
    RoundRobinPlacement,
    StickyPlacement,
    ThresholdStickyPlacement,
)
from ._predictor import LengthPredictor, PredictorConfig, ProgressPredictor, SiblingPredictor

__all__ = [
    "BASELINES",
    "POLICIES",
    "SIMULATION_ONLY",
    "SchedulingPolicy",
    "get_policy",
    "make_migration",
    "make_ordering",
    "make_placement",
    "make_predictor",
]

ORDERINGS: dict[str, Callable[[], OrderingPolicy]] = {
    ProgressivePriority.name: ProgressivePriority,
    FCFSOrdering.name: FCFSOrdering,
}

PLACEMENTS: dict[str, Callable[[], PlacementPolicy]] = {
    DPPlacement.name: DPPlacement,
    LeastLoadPlacement.name: LeastLoadPlacement,
    StickyPlacement.name: StickyPlacement,
    ThresholdStickyPlacement.name: ThresholdStickyPlacement,
    RoundRobinPlacement.name: RoundRobinPlacement,
}

PREDICTORS: dict[str, Callable[[PredictorConfig | None], LengthPredictor]] = {
    SiblingPredictor.name: SiblingPredictor,
    ProgressPredictor.name: ProgressPredictor,
}


@dataclass(frozen=True)
class SchedulingPolicy:
    """One named combination of components.

    ``adaptive_shape`` lets the shape planner change the pool's TP mix;
    otherwise the pool keeps the homogeneous baseline shape.
    """

    name: str
    ordering: str
    placement: str
    migration: str
    adaptive_shape: bool
    predictor: str | None
    description: str
    # The dynamic resource manager: merge engines into higher TP for the tail (_reshape.py).
    dynamic_shape: bool = False
    # Under weights pushed mid-rollout: oldest weight version first, and a trajectory whose
    # KV a load dropped routes as a new one (_versions.py; the live session reads it).
    version_age: bool = False


POLICIES: dict[str, SchedulingPolicy] = {
    p.name: p
    for p in (
        SchedulingPolicy(
            "heddle",
            "progressive",
            "presorted-dp",
            "tool-window",
            True,
            "sibling",
            "progressive priority + presorted-DP placement + migration + adaptive TP shape",
            version_age=True,
        ),
        SchedulingPolicy(
            "heddle-order",
            "progressive",
            "sticky",
            "none",
            False,
            "sibling",
            "ablation: progressive priority only (verl placement, fixed shape)",
        ),
        SchedulingPolicy(
            "heddle-place",
            "progressive",
            "presorted-dp",
            "none",
            False,
            "sibling",
            "ablation: + presorted-DP placement of new trajectories",
        ),
        SchedulingPolicy(
            "heddle-migrate",
            "progressive",
            "presorted-dp",
            "tool-window",
            False,
            "sibling",
            "ablation: + opportunistic migration during tool calls (fixed shape)",
        ),
        SchedulingPolicy(
            "heddle-dynamic",
            "progressive",
            "presorted-dp",
            "tool-window",
            True,
            "sibling",
            "ablation: heddle + the dynamic resource manager (engines merge for the tail)",
            dynamic_shape=True,
        ),
        SchedulingPolicy(
            "heddle-oracle",
            "progressive",
            "presorted-dp",
            "tool-window",
            True,
            "oracle",
            "simulation only: heddle with a predictor that knows every true length",
        ),
        SchedulingPolicy(
            "verl",
            "fcfs",
            "sticky",
            "none",
            False,
            None,
            "baseline: pinned to the engine of the first step (least-requests), FCFS",
        ),
        SchedulingPolicy(
            "verl-star",
            "fcfs",
            "sticky-threshold",
            "none",
            False,
            None,
            "baseline: verl, least-load once max/min engine load exceeds 32",
        ),
        SchedulingPolicy(
            "slime",
            "fcfs",
            "least-load",
            "none",
            False,
            None,
            "baseline: least-load routing at every step (re-prefills on a move)",
        ),
        SchedulingPolicy(
            "fcfs",
            "fcfs",
            "round-robin",
            "none",
            False,
            None,
            "baseline: round-robin first step, then sticky, FCFS",
        ),
    )
}

BASELINES = ("verl", "verl-star", "slime")
# Policies the simulator runs but a RolloutJob may not name: the oracle knows every true
# length; the dynamic resource manager helped in no workload (docs/benchmarks.md), so the
# live session does not carry it out.
SIMULATION_ONLY = ("heddle-oracle", "heddle-dynamic")

_T = TypeVar("_T")


def _lookup(table: dict[str, _T], kind: str, name: str) -> _T:
    try:
        return table[name]
    except KeyError:
        raise ConfigError(f"unknown {kind} {name!r}; choose one of {sorted(table)}") from None


def get_policy(name: str) -> SchedulingPolicy:
    """The policy called ``name`` (raises :class:`ConfigError` listing valid names)."""
    return _lookup(POLICIES, "scheduling policy", name)


def make_ordering(name: str) -> OrderingPolicy:
    return _lookup(ORDERINGS, "ordering policy", name)()


def make_placement(name: str) -> PlacementPolicy:
    return _lookup(PLACEMENTS, "placement policy", name)()


def make_migration(
    name: str, perf: PerfModel, config: MigrationConfig | None = None
) -> MigrationPlanner:
    if name == NoMigration.name:
        return NoMigration()
    if name == ToolWindowMigration.name:
        return ToolWindowMigration(perf, config)
    raise ConfigError(
        f"unknown migration planner {name!r}; choose one of "
        f"{sorted([NoMigration.name, ToolWindowMigration.name])}"
    )


def make_predictor(name: str, config: PredictorConfig | None = None) -> LengthPredictor:
    return _lookup(PREDICTORS, "predictor", name)(config)
