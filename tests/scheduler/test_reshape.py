"""The dynamic resource manager's planner: which engines to merge for the tail, and when."""

from __future__ import annotations

import pytest

from heddle.exceptions import ConfigError
from heddle.rollout import load_cluster
from heddle.scheduler import (
    EngineSnapshot,
    PerfModel,
    TailMergeConfig,
    TailMergePlanner,
    Trajectory,
)


@pytest.fixture(scope="module")
def perf() -> PerfModel:
    """Qwen3-14B on H100s, the paper's cluster."""
    return load_cluster("64xh100").perf_model()


def _held(
    engine: str, n: int, remaining: float = 40_000, context: int = 15_000
) -> tuple[Trajectory, ...]:
    out = []
    for i in range(n):
        t = Trajectory(f"{engine}-{i}", f"g{i}", prompt_tokens=context)
        t.instance = engine
        t.predicted_remaining_tokens = remaining
        out.append(t)
    return tuple(out)


def _pool(loads: dict[str, int], tp: int = 4, **kwargs: float) -> list[EngineSnapshot]:
    return [EngineSnapshot(name, tp, _held(name, n, **kwargs)) for name, n in loads.items()]


def _planner(perf: PerfModel, **config: float) -> TailMergePlanner:
    return TailMergePlanner(perf, (1, 2, 4, 8), 8, TailMergeConfig(**config))


def test_in_the_tail_the_two_emptiest_engines_of_a_tp_merge_into_twice_the_tp(
    perf: PerfModel,
) -> None:
    merge = _planner(perf).plan(_pool({"a": 6, "b": 2, "c": 2, "d": 9}))
    assert merge is not None
    assert sorted(merge.engines) == ["b", "c"] and merge.tp == 8
    # What the perf model says about these trajectories: the merged engine is faster.
    assert 0.1 <= merge.speedup < 1
    assert merge.remaining_s == pytest.approx(40_000 * perf.iteration_time(2, 30_000, 4))


def test_no_merge_while_the_other_engines_could_not_take_the_pairs_trajectories(
    perf: PerfModel,
) -> None:
    # 4 engines, batch cap 100: at occupancy 0.5 the other two take 100 trajectories.
    assert _planner(perf).plan(_pool({"a": 30, "b": 30, "c": 30, "d": 11})) is None
    assert _planner(perf).plan(_pool({"a": 30, "b": 30, "c": 30, "d": 10})) is not None


def test_no_merge_when_the_tail_is_too_short_to_repay_the_restart(perf: PerfModel) -> None:
    loads = {"a": 2, "b": 2, "c": 2}
    assert _planner(perf).plan(_pool(loads, remaining=100)) is None  # ~1 s of decode left
    assert _planner(perf, reshape_s=0.0).plan(_pool(loads, remaining=100)) is not None


def test_no_merge_beyond_a_node_or_the_allowed_tp_sizes(perf: PerfModel) -> None:
    loads = {"a": 2, "b": 2, "c": 2}
    assert _planner(perf).plan(_pool(loads, tp=8)) is None  # TP16 spans nodes
    only_four = TailMergePlanner(perf, (4,), 8)
    assert only_four.plan(_pool(loads)) is None
    assert _planner(perf).plan(_pool({"a": 2, "b": 2})) is None  # nowhere to run meanwhile


def test_no_merge_where_higher_tp_is_not_faster_enough(perf: PerfModel) -> None:
    # At TP4 with a full batch, TP8 is barely faster per iteration of the same work.
    assert _planner(perf, min_speedup=0.5).plan(_pool({"a": 2, "b": 2, "c": 2})) is None


def test_snapshots_group_unfinished_trajectories_by_engine() -> None:
    held = _held("a", 2) + _held("b", 1)
    stray = Trajectory("x", "g", prompt_tokens=10)
    stray.instance = "gone"  # on an engine that no longer serves: not counted
    snaps = TailMergePlanner.snapshots({"a": 4, "b": 4, "c": 2}, [*held, stray])
    assert [(s.name, s.tp, len(s.trajectories)) for s in snaps] == [
        ("a", 4, 2),
        ("b", 4, 1),
        ("c", 2, 0),
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reshape_s", -1.0),
        ("min_speedup", 0.0),
        ("min_remaining_factor", -1.0),
        ("max_pool_occupancy", 0.0),
    ],
)
def test_invalid_settings_are_refused_in_one_sentence(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        TailMergeConfig(**{field: value})
