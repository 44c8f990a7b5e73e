"""The simulator: nothing lost or made twice, deterministic, never beating the lower bound."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from heddle.exceptions import ConfigError
from heddle.rollout import load_cluster, load_workload
from heddle.scheduler import (
    POLICIES,
    ClusterSpec,
    TrajectoryScript,
    WorkloadSpec,
    generate,
    get_policy,
    history_of,
)
from heddle.scheduler.sim import SimConfig, Simulator, lower_bound


@pytest.fixture(scope="module")
def workload() -> WorkloadSpec:
    """A scaled-down coding workload: 12 prompts x 8 samples."""
    return replace(load_workload("coding"), prompts=12, samples_per_prompt=8)


@pytest.fixture(scope="module")
def cluster() -> ClusterSpec:
    """The paper's cluster cut to one 8-GPU node."""
    return replace(load_cluster("64xh100"), gpus=8)


def simulate(
    scripts: list[TrajectoryScript], cluster: ClusterSpec, policy: str, **kwargs: object
) -> Simulator:
    spec_history = kwargs.pop("history", ())
    sim = Simulator(
        scripts,
        cluster,
        get_policy(policy),
        tool_means_s={"sandbox": 0.41},
        history=spec_history,  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )
    return sim


@pytest.mark.slow
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_token_is_generated_once_and_every_trajectory_finishes(
    policy: str, workload: WorkloadSpec, cluster: ClusterSpec
) -> None:
    scripts = generate(workload, 5)
    sim = simulate(scripts, cluster, policy, history=history_of(generate(workload, 6)))
    result = sim.run()
    for script in scripts:
        state = sim.sims[script.id]
        assert state.finish_s is not None
        assert state.traj.generated_tokens == script.total_tokens
        assert state.traj.turns == script.turns
        assert len(state.engines) == script.turns  # one engine began each step
    engine_tokens = sum(e.generated_tokens for e in sim.engines.values())
    assert engine_tokens == sum(s.total_tokens for s in scripts) == result.tokens
    assert result.makespan_s == max(s.finish_s or 0.0 for s in sim.sims.values())
    assert sum(tp * n for tp, n in sim.shape.counts) <= cluster.gpus


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["heddle", "verl", "slime"])
def test_no_policy_beats_the_lower_bound(
    policy: str, workload: WorkloadSpec, cluster: ClusterSpec
) -> None:
    scripts = generate(workload, 7)
    bound = lower_bound(scripts, cluster)
    result = simulate(scripts, cluster, policy, history=history_of(generate(workload, 8))).run()
    assert bound.bound_s <= result.makespan_s
    assert bound.serial_s > max(sum(s.tool_latency_s) for s in scripts)


@pytest.mark.slow
def test_same_seed_same_result(workload: WorkloadSpec, cluster: ClusterSpec) -> None:
    scripts = generate(workload, 9)
    history = history_of(generate(workload, 10))
    a = simulate(scripts, cluster, "heddle", history=history).run()
    b = simulate(scripts, cluster, "heddle", history=history).run()
    assert a == b


def test_a_lone_trajectory_takes_exactly_its_serial_time(cluster: ClusterSpec) -> None:
    """One trajectory on one engine: decode segments, prefills and tools add up exactly."""
    script = TrajectoryScript(
        "t", "g", 0, 300, (500, 700, 200), ("sandbox", "sandbox"), (0.5, 1.25), (40, 60)
    )
    one_gpu = replace(cluster, gpus=1, tensor_parallel_sizes=(1,), baseline_tp=1)
    result = simulate([script], one_gpu, "verl").run()
    perf = one_gpu.perf_model()
    expected = perf.prefill_time(300, 1)
    context = 300
    for i, tokens in enumerate(script.turn_tokens):
        expected += perf.segment_time(1, context, 1, tokens)
        context += tokens
        if i < 2:
            expected += script.tool_latency_s[i] + perf.prefill_time(
                script.tool_output_tokens[i], 1
            )
            context += script.tool_output_tokens[i]
    assert result.makespan_s == pytest.approx(expected, rel=1e-9)


def test_events_are_handled_in_time_order_and_in_agent_loop_order(
    workload: WorkloadSpec, cluster: ClusterSpec
) -> None:
    scripts = generate(workload, 16)
    sim = simulate(
        scripts,
        cluster,
        "heddle",
        history=history_of(generate(workload, 17)),
        config=SimConfig(trace=True),
        shape=cluster.baseline_shape(),  # pinned: Heddle's own scheduling (no planner fallback)
    )
    sim.run()
    times = [t for t, _, _ in sim.trace]
    assert times == sorted(times)
    assert {kind for _, kind, _ in sim.trace} >= {"wake", "tool", "replan"}
    for script in scripts:
        tools = [t for t, kind, key in sim.trace if kind == "tool" and key == script.id]
        state = sim.sims[script.id]
        assert len(tools) == script.turns - 1  # one reply per tool call
        assert state.finish_s is not None
        assert all(t <= state.finish_s for t in tools)  # the last step follows the last tool
        # A trajectory cannot finish before its tools have run back to back.
        assert state.finish_s >= sum(script.tool_latency_s)


def test_cache_awareness_matters(workload: WorkloadSpec, cluster: ClusterSpec) -> None:
    """slime routes each step anew and re-prefills; verl keeps the prefix cache."""
    scripts = generate(workload, 11)
    slime = simulate(scripts, cluster, "slime").run()
    verl = simulate(scripts, cluster, "verl").run()
    assert slime.recompute_tokens > verl.recompute_tokens


@pytest.mark.slow
def test_progressive_priority_queues_the_longest_trajectory_less_than_fcfs(
    workload: WorkloadSpec, cluster: ClusterSpec
) -> None:
    """Two engines, 320 trajectories: steps queue, and the order decides who waits."""
    busy = replace(workload, prompts=40)
    scripts = generate(busy, 12)
    history = history_of(generate(busy, 13))
    two = replace(cluster, gpus=2)
    heddle = simulate(scripts, two, "heddle-order", history=history).run()
    verl = simulate(scripts, two, "verl").run()
    assert verl.longest_queue_delay_s > 0
    assert heddle.longest_queue_delay_s < verl.longest_queue_delay_s


def test_tiny_kv_cache_forces_preemption_but_loses_nothing(workload: WorkloadSpec) -> None:
    """Qwen3-32B on one GPU keeps ~13K tokens of KV: enough for any one trajectory here."""
    short = replace(workload, prompts=4, max_output_tokens=4000)
    scripts = generate(short, 14)
    small = ClusterSpec("tight", 1, 1, "qwen3-32b", "h100-sxm", (1,), 1, batch_cap=100)
    for policy in ("verl", "heddle-order"):
        sim = simulate(scripts, small, policy)
        result = sim.run()
        assert result.preemptions > 0
        assert all(s.traj.generated_tokens == s.script.total_tokens for s in sim.sims.values())


def test_a_trajectory_larger_than_the_kv_cache_is_refused(workload: WorkloadSpec) -> None:
    scripts = generate(replace(workload, prompts=4), 14)
    small = ClusterSpec("tight", 1, 1, "qwen3-32b", "h100-sxm", (1,), 1, batch_cap=100)
    with pytest.raises(ConfigError, match=r"holds \d+ KV tokens but a trajectory .* reaches"):
        simulate(scripts, small, "verl")


@pytest.mark.slow
def test_predictor_quality_is_reported_for_heddle_only(
    workload: WorkloadSpec, cluster: ClusterSpec
) -> None:
    scripts = generate(workload, 15)
    heddle = simulate(scripts, cluster, "heddle").run()
    verl = simulate(scripts, cluster, "verl").run()
    assert set(heddle.predictor) == {"step_1", "step_2", "step_4"}
    assert not math.isnan(heddle.predictor["step_2"]["pearson_all"])
    assert verl.predictor == {}


def test_invalid_inputs_are_refused(cluster: ClusterSpec) -> None:
    with pytest.raises(ConfigError, match="no trajectories"):
        simulate([], cluster, "verl")
    with pytest.raises(ConfigError, match="replan_interval_s=0"):
        SimConfig(replan_interval_s=0)
