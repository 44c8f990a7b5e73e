"""Presorted DP: optimal against brute force on small cases; the table-free split finds the
same optimum and spreads the load."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.exceptions import ConfigError
from heddle.scheduler import EngineInstance, aggregate, group_cost, solve_contiguous, solve_lengths
from heddle.scheduler._dp import search_contiguous, split_contiguous

from ..conftest import make_instance

lengths_st = st.lists(
    st.one_of(st.floats(1.0, 100.0), st.integers(1, 5).map(float)), min_size=1, max_size=7
).map(lambda xs: sorted(xs, reverse=True))


def brute_force_any_assignment(lengths: list[float], instances: list[EngineInstance]) -> float:
    best = float("inf")
    for assign in itertools.product(range(len(instances)), repeat=len(lengths)):
        cost = 0.0
        for j, inst in enumerate(instances):
            members = [lengths[i] for i in range(len(lengths)) if assign[i] == j]
            cost = max(cost, group_cost(inst, len(members), max(members, default=0.0)))
        best = min(best, cost)
    return best


def brute_force_contiguous(lengths: list[float], instances: list[EngineInstance]) -> float:
    n, m = len(lengths), len(instances)
    best = float("inf")
    for cuts in itertools.combinations_with_replacement(range(n + 1), m - 1):
        bounds = [0, *cuts, n]
        cost = max(
            group_cost(
                inst,
                bounds[j + 1] - bounds[j],
                lengths[bounds[j]] if bounds[j + 1] > bounds[j] else 0.0,
            )
            for j, inst in enumerate(instances)
        )
        best = min(best, cost)
    return best


def solve(
    lengths: list[float], instances: list[EngineInstance]
) -> tuple[float, list[tuple[int, int]]]:
    return solve_contiguous(aggregate(np.array(lengths), 1000), instances)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    lengths=lengths_st,
    count=st.integers(1, 4),
    cap=st.integers(1, 4),
    alpha=st.floats(0.0, 0.6),
)
def test_optimal_over_all_assignments_on_identical_instances(
    lengths: list[float], count: int, cap: int, alpha: float
) -> None:
    instances = [make_instance(f"i{j}", 0.5, cap, alpha) for j in range(count)]
    makespan, _ = solve(lengths, instances)
    assert makespan == pytest.approx(brute_force_any_assignment(lengths, instances), rel=1e-9)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    lengths=lengths_st,
    shapes=st.lists(
        st.tuples(st.sampled_from([1.0, 0.6, 0.35]), st.integers(1, 4), st.floats(0.0, 0.6)),
        min_size=1,
        max_size=3,
    ),
)
def test_placement_is_optimal_over_all_assignments_on_mixed_instances(
    lengths: list[float], shapes: list[tuple[float, int, float]]
) -> None:
    """Different T, caps and curves: trying instance orders finds the true optimum."""
    instances = [make_instance(f"i{j}", *shape) for j, shape in enumerate(shapes)]
    makespan, groups = solve_lengths(lengths, instances)
    assert makespan == pytest.approx(brute_force_any_assignment(lengths, instances), rel=1e-9)
    placed = sorted(int(p) for _, positions in groups for p in positions)
    assert placed == list(range(len(lengths)))


def test_fastest_first_alone_can_miss_the_optimum() -> None:
    """Why the placement tries instance orders: a slow engine should take the one long job."""
    fast, slow = make_instance("fast", 0.6, 1, 0.0), make_instance("slow", 1.0, 1, 0.0)
    lengths = [2.0, 1.0, 1.0, 1.0]
    fastest_first, _ = solve(lengths, [fast, slow])
    best, _ = solve_lengths(lengths, [fast, slow])
    assert fastest_first == pytest.approx(2.4)
    assert best == pytest.approx(2.0) == brute_force_any_assignment(lengths, [fast, slow])


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    lengths=lengths_st,
    shapes=st.lists(
        st.tuples(st.sampled_from([1.0, 0.6, 0.35]), st.integers(1, 4), st.floats(0.0, 0.6)),
        min_size=1,
        max_size=3,
    ),
)
def test_optimal_over_contiguous_partitions_for_any_instances(
    lengths: list[float], shapes: list[tuple[float, int, float]]
) -> None:
    instances = [make_instance(f"i{j}", *shape) for j, shape in enumerate(shapes)]
    makespan, ranges = solve(lengths, instances)
    assert makespan == pytest.approx(brute_force_contiguous(lengths, instances), rel=1e-9)
    # The ranges it returns achieve the makespan it reports and cover every item once.
    covered = [i for start, end in ranges for i in range(start, end)]
    assert covered == list(range(len(lengths)))
    achieved = max(
        group_cost(inst, end - start, lengths[start] if end > start else 0.0)
        for inst, (start, end) in zip(instances, ranges, strict=True)
    )
    assert achieved == pytest.approx(makespan, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.floats(1.0, 40_000.0), min_size=1, max_size=300),
    shapes=st.lists(
        st.tuples(st.sampled_from([1.0, 0.6, 0.35]), st.integers(1, 40), st.floats(0.0, 0.6)),
        min_size=1,
        max_size=6,
    ),
)
def test_parametric_search_agrees_with_the_dp(
    lengths: list[float], shapes: list[tuple[float, int, float]]
) -> None:
    instances = [make_instance(f"i{j}", *shape) for j, shape in enumerate(shapes)]
    ordered = np.sort(np.array(lengths))[::-1]
    exact, _ = solve_contiguous(aggregate(ordered, len(ordered) + 1), instances)
    approx = search_contiguous(ordered, instances, rel_tol=1e-3)
    assert exact * (1 - 1e-9) <= approx <= exact * (1 + 1.1e-3)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(
        st.one_of(st.floats(1.0, 40_000.0), st.sampled_from([0.0, 7.0, 512.0])),
        min_size=0,
        max_size=300,
    ),
    shapes=st.lists(
        st.tuples(st.sampled_from([1.0, 0.6, 0.35]), st.integers(1, 40), st.floats(0.0, 0.6)),
        min_size=1,
        max_size=6,
    ),
)
def test_split_finds_the_dps_optimum_exactly(
    lengths: list[float], shapes: list[tuple[float, int, float]]
) -> None:
    """The table-free split (what placement uses) lands on the DP's optimum, not near it."""
    instances = [make_instance(f"i{j}", *shape) for j, shape in enumerate(shapes)]
    ordered = np.sort(np.array(lengths, dtype=np.float64))[::-1]
    exact, _ = solve_contiguous(aggregate(ordered, max(len(ordered), 2)), instances)
    makespan, order, ranges = split_contiguous(ordered, [instances])
    assert order == 0
    assert makespan == pytest.approx(exact, rel=1e-9, abs=1e-9)
    covered = [i for start, end in ranges for i in range(start, end)]
    assert covered == list(range(len(ordered)))
    achieved = max(
        (
            group_cost(inst, end - start, float(ordered[start]) if end > start else 0.0)
            for inst, (start, end) in zip(instances, ranges, strict=True)
        ),
        default=0.0,
    )
    assert achieved == pytest.approx(makespan, rel=1e-9, abs=1e-9)


def test_split_keeps_every_engine_busy_where_the_dp_leaves_some_idle() -> None:
    """Same makespan, work spread by throughput: the DP's split is one of many optima and
    may leave engines empty, which a wrong prediction then punishes."""
    from heddle.scheduler import HARDWARE_PRESETS, MODEL_PRESETS, PerfModel

    perf = PerfModel(MODEL_PRESETS["qwen3-14b"], HARDWARE_PRESETS["h100-sxm"])
    instances = [perf.instance(f"e{i}", 1) for i in range(64)]
    rng = np.random.default_rng(3)
    # A few long trajectories and many short ones: the long ones fix the makespan.
    lengths = np.sort(np.concatenate([rng.uniform(20_000, 30_000, 8), rng.uniform(50, 400, 4000)]))
    ordered = lengths[::-1].copy()
    exact, dp_ranges = solve_contiguous(aggregate(ordered, len(ordered)), instances)
    makespan, _, ranges = split_contiguous(ordered, [instances])
    assert makespan == pytest.approx(exact, rel=1e-9)
    assert sum(1 for start, end in dp_ranges if end == start) > 0
    assert min(end - start for start, end in ranges) > 0
    # The eight long ones fix the makespan; the rest share the short ones' tokens evenly.
    work = [float(ordered[start:end].sum()) for start, end in ranges[8:]]
    assert max(work) <= 1.2 * min(work)


def test_split_picks_the_best_of_several_orders() -> None:
    fast, slow = make_instance("fast", 0.6, 1, 0.0), make_instance("slow", 1.0, 1, 0.0)
    lengths = np.array([2.0, 1.0, 1.0, 1.0])
    makespan, order, _ = split_contiguous(lengths, [[fast, slow], [slow, fast]])
    assert (makespan, order) == (pytest.approx(2.0), 1)


def test_longest_trajectory_goes_to_the_fastest_instance() -> None:
    fast, slow = make_instance("fast", 0.3, 8), make_instance("slow", 1.0, 8)
    lengths = [10_000.0, 500.0, 400.0, 300.0, 200.0]
    makespan, ranges = solve(lengths, [fast, slow])
    assert ranges[0][0] == 0 and ranges[0][1] >= 1
    assert makespan < group_cost(slow, 1, 10_000.0)


def test_aggregation_keeps_every_trajectory_and_the_long_ones_exact() -> None:
    lengths = np.sort(np.random.default_rng(0).lognormal(8, 1, 5000))[::-1]
    items = aggregate(lengths, 256)
    assert len(items) <= 256
    assert int(items.count.sum()) == 5000
    assert items.work.sum() == pytest.approx(lengths.sum())
    assert np.all(items.count[:128] == 1)
    assert items.longest[0] == lengths[0]


def test_aggregated_plan_is_close_to_exact() -> None:
    from heddle.scheduler import HARDWARE_PRESETS, MODEL_PRESETS, PerfModel

    perf = PerfModel(MODEL_PRESETS["qwen3-14b"], HARDWARE_PRESETS["h100-sxm"])
    instances = [perf.instance(f"e{i}", 1) for i in range(16)]
    lengths = np.sort(np.random.default_rng(1).lognormal(8.5, 0.9, 2000).clip(1, 40960))[::-1]
    exact, _ = solve_contiguous(aggregate(lengths, 4000), instances)
    rough, _ = solve_contiguous(aggregate(lengths, 1024), instances)
    assert exact <= rough <= exact * 1.05


def test_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="no engine instances"):
        solve_contiguous(aggregate(np.array([1.0]), 10), [])
    with pytest.raises(ConfigError, match="no engine instances"):
        split_contiguous(np.array([1.0]), [[]])
    with pytest.raises(ConfigError, match="max_items=1"):
        aggregate(np.array([1.0]), 1)
