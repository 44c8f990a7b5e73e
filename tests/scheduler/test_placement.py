"""Placement policies: Heddle's DP plan and the step-centric baselines route as described."""

from __future__ import annotations

import pytest

from heddle.exceptions import ConfigError
from heddle.scheduler import (
    ClusterView,
    DPPlacement,
    LeastLoadPlacement,
    PerfModel,
    RoundRobinPlacement,
    StickyPlacement,
    ThresholdStickyPlacement,
    Trajectory,
    plan_placement,
)

from ..conftest import make_instance


def view(loads: dict[str, int]) -> ClusterView:
    return ClusterView([make_instance(n) for n in loads], loads)


def traj(tid: str, instance: str | None = None, remaining: float = 0.0) -> Trajectory:
    t = Trajectory(tid, "g", 100, instance=instance)
    t.predicted_remaining_tokens = remaining
    return t


def test_slime_routes_every_step_to_the_least_loaded_engine() -> None:
    policy = LeastLoadPlacement()
    assert policy.route(traj("a", instance="e0"), view({"e0": 5, "e1": 2, "e2": 3})) == "e1"


def test_slime_keeps_a_step_on_its_engine_when_that_engine_ties_for_least_load() -> None:
    policy = LeastLoadPlacement()
    loads = {"e0": 2, "e1": 2, "e2": 3}
    assert policy.route(traj("a", instance="e1"), view(loads)) == "e1"  # not the first listed
    assert policy.route(traj("b", instance="e2"), view(loads)) == "e0"
    assert policy.route(traj("c"), view(loads)) == "e0"  # a first step: the earliest listed


def test_verl_pins_a_trajectory_to_its_first_engine() -> None:
    policy = StickyPlacement()
    loads = {"e0": 50, "e1": 0}
    assert policy.route(traj("a"), view(loads)) == "e1"  # first step: least requests
    assert policy.route(traj("a", instance="e0"), view(loads)) == "e0"  # stays, however loaded


def test_verl_reroutes_when_its_engine_is_gone() -> None:
    assert StickyPlacement().route(traj("a", instance="dead"), view({"e0": 3, "e1": 1})) == "e1"


def test_verl_star_switches_to_least_load_past_the_ratio() -> None:
    policy = ThresholdStickyPlacement(max_load_ratio=32)
    at_ratio = view({"e0": 64, "e1": 2})  # 64 / 2 = 32: not past it
    assert policy.route(traj("a", instance="e0"), at_ratio) == "e0"
    past = view({"e0": 65, "e1": 2})
    assert policy.route(traj("a", instance="e0"), past) == "e1"
    idle = view({"e0": 33, "e1": 0})  # an idle engine counts as load 1
    assert policy.route(traj("a", instance="e0"), idle) == "e1"


def test_verl_star_ratio_must_exceed_one() -> None:
    with pytest.raises(ConfigError, match="max_load_ratio=1"):
        ThresholdStickyPlacement(1.0)


def test_round_robin_deals_first_steps_in_turn() -> None:
    policy = RoundRobinPlacement()
    v = view({"e0": 0, "e1": 0, "e2": 0})
    assert [policy.route(traj(f"t{i}"), v) for i in range(4)] == ["e0", "e1", "e2", "e0"]


def test_cluster_view_needs_instances() -> None:
    with pytest.raises(ConfigError, match="no engine instances are ready"):
        ClusterView([], {})


def test_dp_plan_covers_every_trajectory_and_puts_the_longest_on_the_fastest(
    perf: PerfModel,
) -> None:
    instances = [perf.instance("tp4", 4), perf.instance("tp1-a", 1), perf.instance("tp1-b", 1)]
    trajs = [traj(f"t{i}", remaining=r) for i, r in enumerate([30_000, 900, 800, 700, 600, 500])]
    plan = plan_placement(trajs, instances)
    assert set(plan.assignment) == {t.id for t in trajs}
    assert plan.assignment["t0"] == "tp4"
    assert plan.makespan_s > 0


def test_dp_placement_sends_new_trajectories_where_the_plan_says_and_keeps_old_ones(
    perf: PerfModel,
) -> None:
    instances = [perf.instance("tp4", 4), perf.instance("tp1", 1)]
    v = ClusterView(instances, {"tp4": 0, "tp1": 0})
    policy = DPPlacement()
    long, short = traj("long", remaining=30_000), traj("short", remaining=100)
    assert policy.target(long) is None
    policy.replan([long, short], v)
    assert policy.target(long) == "tp4"
    assert policy.route(long, v) == "tp4"
    resident = traj("short", instance="tp1", remaining=100)
    assert policy.route(resident, v) == "tp1"  # moving is the migration planner's job


def test_dp_placement_reroutes_a_step_stuck_behind_a_long_queue(perf: PerfModel) -> None:
    instances = [perf.instance("a", 1), perf.instance("b", 1)]
    policy = DPPlacement(rebalance_margin=32)
    resident = traj("t", instance="a")
    assert policy.route(resident, ClusterView(instances, {"a": 40, "b": 8})) == "a"  # 32: stay
    assert policy.route(resident, ClusterView(instances, {"a": 41, "b": 8})) == "b"
    assert (
        DPPlacement(rebalance_margin=None).route(
            resident, ClusterView(instances, {"a": 500, "b": 0})
        )
        == "a"
    )


def test_siblings_with_equal_predictions_are_spread_across_engines(perf: PerfModel) -> None:
    """Before they run, GRPO siblings share one prediction; they must not share one engine."""
    instances = [perf.instance(f"e{i}", 1) for i in range(4)]
    trajs = []
    for g in range(8):
        for s in range(8):
            t = Trajectory(f"g{g}-s{s}", f"g{g}", 100)
            t.predicted_remaining_tokens = 5000.0 + g  # within 25%: a tie
            trajs.append(t)
    plan = plan_placement(trajs, instances)
    for g in range(8):
        engines = [plan.assignment[f"g{g}-s{s}"] for s in range(8)]
        assert max(engines.count(e) for e in set(engines)) <= 2, engines
    counts = [list(plan.assignment.values()).count(i.name) for i in instances]
    assert max(counts) - min(counts) <= 1
