"""Shape planner: within budget and nodes, deterministic, and it favours TP for long tails."""

from __future__ import annotations

import numpy as np
import pytest

from heddle.exceptions import ConfigError
from heddle.scheduler import AnnealingShapePlanner, FixedShape, PerfModel, PoolShape, ShapeConfig


def long_tail(n: int = 2048, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(4000), 1.0, n), 10, 40960)


def test_shape_stays_within_budget_and_nodes_and_uses_every_gpu(perf: PerfModel) -> None:
    config = ShapeConfig(gpu_budget=64, gpus_per_node=8, seed=1)
    plan = AnnealingShapePlanner(perf, config).plan(long_tail(), PoolShape.of({1: 64}))
    plan.shape.validate(64, 8, (1, 2, 4, 8))
    assert plan.shape.gpus == 64


def test_a_long_tail_earns_high_tp_engines(perf: PerfModel) -> None:
    config = ShapeConfig(gpu_budget=64, gpus_per_node=8, seed=1)
    plan = AnnealingShapePlanner(perf, config).plan(long_tail(), PoolShape.of({1: 64}))
    assert plan.reshape
    assert max(plan.shape.tps()) >= 4
    assert plan.current_makespan_s is not None
    assert plan.predicted_makespan_s + config.reshape_s < plan.current_makespan_s


def test_same_seed_same_shape(perf: PerfModel) -> None:
    config = ShapeConfig(gpu_budget=32, gpus_per_node=8, seed=7)
    lengths = long_tail(1000, 3)
    a = AnnealingShapePlanner(perf, config).plan(lengths, None)
    b = AnnealingShapePlanner(perf, config).plan(lengths, None)
    assert a == b


def test_a_costly_reshape_keeps_the_current_shape(perf: PerfModel) -> None:
    current = PoolShape.of({1: 16})
    config = ShapeConfig(gpu_budget=16, gpus_per_node=8, reshape_s=1e9)
    plan = AnnealingShapePlanner(perf, config).plan(long_tail(500), current)
    assert plan.shape == current and not plan.reshape


def test_no_work_keeps_the_shape(perf: PerfModel) -> None:
    current = PoolShape.of({2: 4})
    plan = AnnealingShapePlanner(perf, ShapeConfig(gpu_budget=8)).plan([], current)
    assert plan.shape == current and not plan.reshape


def test_fixed_shape_is_obeyed() -> None:
    pinned = PoolShape.of({4: 1, 1: 4})
    assert FixedShape(pinned).plan([1.0, 2.0], PoolShape.of({1: 8})).shape == pinned


def test_invalid_budgets_and_sizes_say_what_would_be_valid(perf: PerfModel) -> None:
    with pytest.raises(ConfigError, match="does not divide gpus_per_node=8"):
        ShapeConfig(gpu_budget=8, tensor_parallel_sizes=(1, 3))
    with pytest.raises(ConfigError, match="gpu_budget=0 is below the smallest allowed TP size 1"):
        ShapeConfig(gpu_budget=0)
    with pytest.raises(ConfigError, match="gpu_budget=-4"):
        ShapeConfig(gpu_budget=-4)
    with pytest.raises(ConfigError, match="reshape_s=-1"):
        ShapeConfig(gpu_budget=8, reshape_s=-1)
