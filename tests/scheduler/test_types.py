"""Pool shapes and TP sizes: invalid input is refused with a sentence that says what fits."""

from __future__ import annotations

import pytest

from heddle.exceptions import ConfigError, InfeasibleError
from heddle.scheduler import (
    PoolShape,
    Trajectory,
    TrajectoryState,
    check_tp_sizes,
    fits_nodes,
    node_sizes,
)


def test_shape_counts_gpus_and_instances() -> None:
    shape = PoolShape.of({4: 2, 1: 8})
    assert shape.gpus == 16 and shape.num_instances == 10
    assert str(shape) == "2xTP4 + 8xTP1"
    assert shape == PoolShape.of([1] * 8 + [4, 4])
    assert shape.tps()[:2] == [4, 4]


def test_tp_that_does_not_divide_the_node_is_refused() -> None:
    with pytest.raises(
        ConfigError,
        match=r"size 3 does not divide gpus_per_node=8; use sizes from \[1, 2, 4, 8\]",
    ):
        check_tp_sizes([1, 3], 8)
    with pytest.raises(ConfigError, match="is empty"):
        check_tp_sizes([], 8)


def test_shape_over_budget_or_with_disallowed_tp_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs 20 GPUs but the budget is 16"):
        PoolShape.of({4: 3, 1: 8}).validate(16, 8, [1, 2, 4, 8])
    with pytest.raises(ConfigError, match="uses TP2; allowed sizes are"):
        PoolShape.of({2: 1}).validate(16, 8, [1, 4])
    with pytest.raises(ConfigError, match="GPU budget -1"):
        PoolShape.of({1: 1}).validate(-1, 8, [1])
    with pytest.raises(ConfigError, match="both must be positive"):
        PoolShape.of({0: 1})


def test_instances_never_span_nodes() -> None:
    assert node_sizes(20, 8) == [8, 8, 4]
    assert fits_nodes([8, 8, 4], [8, 8, 4])
    assert not fits_nodes([8, 8, 8], [8, 8, 4])
    # First-fit decreasing would fail here (3 then 2+2 strands a 2); an exact search packs it.
    assert fits_nodes([3, 2, 2, 2], [6, 3])
    # 7 GPUs on 6-GPU nodes: a full node and a 1-GPU remainder cannot hold 3 + 2 + 2.
    with pytest.raises(InfeasibleError, match="never spans nodes"):
        PoolShape.of({3: 1, 2: 2}).validate(7, 6, [1, 2, 3, 6])


def test_trajectory_context_starts_at_the_prompt() -> None:
    t = Trajectory("t", "g", 321)
    assert t.context_tokens == 321 and t.state is TrajectoryState.QUEUED
    assert TrajectoryState.DONE.finished and not TrajectoryState.IN_TOOL.finished
    with pytest.raises(ConfigError, match="prompt_tokens=-1"):
        Trajectory("t", "g", -1)
