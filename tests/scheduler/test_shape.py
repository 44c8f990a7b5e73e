"""Shape planner: within budget and nodes, deterministic, and it favours TP for long tails."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from heddle.exceptions import ConfigError, InfeasibleError
from heddle.scheduler import (
    AnnealingShapePlanner,
    ClusterSpec,
    FinishedTrajectory,
    FixedShape,
    PerfModel,
    PoolShape,
    ShapeConfig,
    get_policy,
)
from heddle.scheduler.sim import SimConfig, SimulatedShapePlanner, Simulator, workload_sketch
from heddle.scheduler.sim._plan import ReplicaRun, ReplicaShapePlanner, resample_groups


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


# -- the simulating planner (issue 14): KV capacity, recompute, batch cap, tool time ------


def records(
    n: int, prompt: int, output: int, turns: int, sigma: float = 0.3, seed: int = 0
) -> list[FinishedTrajectory]:
    rng = np.random.default_rng(seed)
    return [
        FinishedTrajectory(
            f"g{i // 8}",
            prompt,
            max(turns, int(output * np.exp(sigma * rng.standard_normal()))),
            turns,
        )
        for i in range(n)
    ]


def simulated(perf: PerfModel, gpus: int = 8, **kwargs: Any) -> SimulatedShapePlanner:
    config = ShapeConfig(gpu_budget=gpus, gpus_per_node=8, reshape_s=0.0)
    return SimulatedShapePlanner(perf, config, **kwargs)


@pytest.mark.slow
def test_under_kv_pressure_the_planner_prefers_high_tp(perf: PerfModel) -> None:
    # 30K-token prompts and 2K-token tool replies: a TP1 engine's ~240K-token KV cache
    # holds a handful of these contexts, so TP1 recomputes.
    planner = simulated(perf)
    plan = planner.plan_history(
        records(256, 30_000, 3_000, 4), None, tool_means_s={"t": 1.0}, tool_output_tokens=2000
    )
    assert min(plan.shape.tps()) >= 4, planner.scores
    assert planner.scores["8xTP1"] > 1.1 * plan.predicted_makespan_s


@pytest.mark.slow
def test_with_short_contexts_and_plenty_of_work_the_planner_prefers_tp1(perf: PerfModel) -> None:
    # Throughput-bound: short contexts, many trajectories. TP1 reads the weights
    # on every GPU but pays no all-reduce and fills eight batches.
    planner = simulated(perf, caps=(None,))
    plan = planner.plan_history(
        records(1500, 200, 1000, 2), None, tool_means_s={"t": 0.1}, tool_output_tokens=50
    )
    assert plan.shape == PoolShape.of({1: 8}), planner.scores
    assert planner.scores["1xTP8"] > 1.5 * plan.predicted_makespan_s


def test_tool_time_counts(perf: PerfModel) -> None:
    # The same tokens with 20 s tools (three calls per trajectory): the predicted
    # makespan grows by more than one tool call (the gaps also thin the batches).
    planner = simulated(perf, caps=(None,))
    quick = planner.plan_history(records(256, 1000, 4000, 4), None, tool_means_s={"t": 0.1})
    slow = planner.plan_history(records(256, 1000, 4000, 4), None, tool_means_s={"t": 20.0})
    assert slow.predicted_makespan_s >= quick.predicted_makespan_s + 20.0


@pytest.mark.slow
def test_the_replica_ranks_shapes_as_the_full_simulation_does(perf: PerfModel) -> None:
    # A 16-GPU pool planned on an 8-GPU replica with every second trajectory: the
    # replica's makespans of the homogeneous shapes rank them as full simulations do.
    history = records(512, 1000, 4000, 4, sigma=0.8, seed=3)
    planner = simulated(perf, gpus=16, mini_gpus=8, min_sample=64, caps=(None, 64))
    plan = planner.plan_history(history, None, tool_means_s={"t": 0.5}, tool_output_tokens=300)
    sketch = workload_sketch(history, tool_latency_s=0.5, tool_output_tokens=300)
    cluster = ClusterSpec("t", 16, 8, "qwen3-14b", "h100-sxm", (1, 2, 4, 8), 1)
    full: dict[int, float] = {}
    for tp in (1, 2, 4, 8):
        full[tp] = min(
            Simulator(
                sketch,
                cluster,
                get_policy("verl"),
                tool_means_s={"tool": 0.5},
                shape=PoolShape.of({tp: 16 // tp}),
                config=SimConfig(max_trajectories_per_engine=cap),
            )
            .run()
            .makespan_s
            for cap in (None, 64)
        )
    replica = {tp: planner.scores[str(PoolShape.of({tp: 8 // tp}))] for tp in (1, 2, 4, 8)}
    assert sorted(full, key=full.__getitem__) == sorted(replica, key=replica.__getitem__)
    best = min(full, key=full.__getitem__)
    assert plan.shape == PoolShape.of({best: 16 // best})
    for tp, makespan in full.items():  # and the replica's makespans are close to the full's
        assert replica[tp] == pytest.approx(makespan, rel=0.15)


@pytest.mark.slow
def test_the_simulator_plans_heddle_with_the_simulating_planner(perf: PerfModel) -> None:
    history = [
        replace(r, tool_output_tokens=(2000, 2000, 2000)) for r in records(256, 30_000, 3_000, 4)
    ]
    cluster = ClusterSpec("t", 8, 8, "qwen3-14b", "h100-sxm", (1, 2, 4, 8), 1)
    scripts = workload_sketch(history, tool_latency_s=1.0, tool_output_tokens=2000)
    sim = Simulator(
        scripts, cluster, get_policy("heddle"), tool_means_s={"tool": 1.0}, history=history
    )
    plan = simulated(perf).plan_history(
        history, cluster.baseline_shape(), tool_means_s={"tool": 1.0}
    )
    assert sim.shape == plan.shape
    assert sim.shape != cluster.baseline_shape()


def test_a_context_no_tp_holds_is_refused(perf: PerfModel) -> None:
    with pytest.raises(InfeasibleError, match="longest context"):
        simulated(perf).plan_history(records(4, 5_000_000, 10, 1), None, tool_means_s={"t": 0.0})


@pytest.mark.slow
def test_where_trajectory_scheduling_is_not_predicted_to_help_heddle_runs_the_best_static_config(
    perf: PerfModel,
) -> None:
    # Equal lengths, contexts that crowd the KV cache: nothing for LPT to gain, and
    # progressive priority keeps every trajectory growing in lockstep. The planner
    # sees it in the replica and falls back to verl at its best cap.
    history = [
        replace(r, tool_output_tokens=(200, 200, 200))
        for r in records(1024, 500, 4000, 4, sigma=0.05)
    ]
    planner = simulated(perf, gpus=8, caps=(None, 128))
    plan = planner.plan_history(history, None, tool_means_s={"t": 0.4}, policy="heddle")
    # The replica is the whole pool here, so Heddle and its ordering-only variant both run.
    own = min(planner.scores[f"heddle {plan.shape}"], planner.scores[f"heddle-order {plan.shape}"])
    (static,) = [v for k, v in planner.scores.items() if k.startswith("static ")]
    assert static <= planner.scores[str(plan.shape)]  # no worse than the proxy at its best cap
    # Heddle keeps trajectory scheduling only when the replica shows a clear (10%) win,
    # on the sketch and on each resample of its groups it was tried on.
    static_chosen = plan.fallback_policy in ("verl", "slime")
    draws = [
        (v, planner.scores[f"static {k.split(' draw ')[0].split(' ', 1)[1]} draw {k[-1]}"])
        for k, v in planner.scores.items()
        if " draw " in k and not k.startswith("static ")
    ]
    lost = own > 0.90 * static or any(o > 0.90 * f for o, f in draws)
    assert static_chosen == lost
    assert plan.predicted_makespan_s == (static if static_chosen else own)
    assert plan.fallback_policy in (None, "heddle-order", "verl", "slime")
    keep = simulated(
        perf,
        gpus=8,
        caps=(None, 128),
        margin=0.0,
        fallbacks=("verl",),
        per_engine_variants={},
        draws=0,
    )
    again = keep.plan_history(history, None, tool_means_s={"t": 0.4}, policy="heddle")
    assert (again.fallback_policy is None) == (
        keep.scores[f"heddle {again.shape}"] <= keep.scores[str(again.shape)]
    )


class ScriptedPlanner(ReplicaShapePlanner):
    """A planner whose replica runs take scripted makespans: ``own`` for Heddle's
    ordering and ``static`` for every step-centric run, per draw (0: the sketch)."""

    def __init__(self, perf: PerfModel, own: list[float], static: list[float], **kw: Any) -> None:
        config = ShapeConfig(gpu_budget=8, gpus_per_node=8, reshape_s=0.0)
        super().__init__(perf, config, caps=(None,), fallbacks=("verl",), **kw)
        self.own, self.static = own, static

    def _makespan(self, run: ReplicaRun) -> float:
        first = run.scripts[0].id
        draw = int(first[1 : first.index("-")]) if first.startswith("d") else 0
        return (self.static if run.policy == "verl" else self.own)[draw]


@pytest.mark.parametrize(
    ("own", "draws", "kept"),
    [
        ([80.0, 85.0, 88.0], 2, True),  # 20%, 15% and 12% ahead: kept
        ([80.0, 85.0, 95.0], 2, False),  # 5% ahead on the second resample: the margin is 10%
        ([80.0, 95.0, 80.0], 2, False),  # lost on the first: the second is not run
        ([80.0, 95.0, 95.0], 0, True),  # no resamples: the sketch alone decides
        ([95.0, 80.0, 80.0], 2, False),  # not ahead on the sketch: no resample is run
    ],
)
def test_trajectory_scheduling_is_kept_only_if_it_wins_on_resamples_of_the_sketch_too(
    perf: PerfModel, own: list[float], draws: int, kept: bool
) -> None:
    planner = ScriptedPlanner(perf, own, [100.0] * 3, draws=draws)
    sketch = workload_sketch(records(64, 200, 400, 2), tool_latency_s=0.1)
    plan = planner.plan_workload(sketch, None, policy="heddle-order")
    assert (plan.fallback_policy is None) == kept
    tried = sorted(k for k in planner.scores if " draw " in k and not k.startswith("static"))
    ran = 0 if own[0] > 90.0 else next((d for d in range(1, draws + 1) if own[d] > 90.0), draws)
    assert len(tried) == ran


def test_a_resample_of_the_groups_is_as_large_deterministic_and_renamed(perf: PerfModel) -> None:
    sketch = workload_sketch(records(64, 200, 400, 2), tool_latency_s=0.1)
    draw = resample_groups(sketch, 1)
    assert len({s.group_id for s in draw}) == len({s.group_id for s in sketch}) == 8
    assert len({s.id for s in draw}) == len(draw)
    assert draw == resample_groups(sketch, 1)
    assert draw != resample_groups(sketch, 2)
    # Whole groups: each copy holds all eight samples of the group it copies.
    assert all(sum(1 for t in draw if t.group_id == g) == 8 for g in {s.group_id for s in draw})
    with pytest.raises(ConfigError, match="draws=-1"):
        ScriptedPlanner(perf, [1.0], [1.0], draws=-1)
