"""The lower bound: no policy, shape or in-flight cap ever beats it, and it is tighter than
the old bound where the KV cache, not the batch cap, limits the batch."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heddle.rollout import load_workload
from heddle.scheduler import (
    BASELINES,
    ClusterSpec,
    PoolShape,
    generate,
    get_policy,
    history_of,
)
from heddle.scheduler.sim import SimConfig, Simulator, lower_bound

POLICIES = ("heddle", *BASELINES, "fcfs")


@st.composite
def cases(draw: st.DrawFn) -> tuple[list, ClusterSpec, int]:  # type: ignore[type-arg]
    """A handful of GRPO groups with long prompts (so the KV cache binds) on 2-4 GPUs."""
    base = load_workload("coding")
    spec = replace(
        base,
        prompts=draw(st.integers(1, 4)),
        samples_per_prompt=draw(st.integers(1, 4)),
        prompt_tokens=replace(
            base.prompt_tokens, median=draw(st.sampled_from([500.0, 20_000.0, 60_000.0])),
            maximum=80_000.0,
        ),
        output_median=draw(st.sampled_from([200.0, 2_000.0])),
        max_output_tokens=8_000,
    )  # fmt: skip
    gpus = draw(st.sampled_from([2, 4]))
    cluster = ClusterSpec(
        "case", gpus, gpus, draw(st.sampled_from(["qwen3-8b", "qwen3-14b"])), "h100-sxm",
        (1, 2), 1, batch_cap=draw(st.sampled_from([1, 3, 100])),
    )  # fmt: skip
    return generate(spec, draw(st.integers(0, 999))), cluster, draw(st.sampled_from([0, 1, 2]))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_no_policy_shape_or_cap_beats_the_bound(case: tuple[list, ClusterSpec, int]) -> None:  # type: ignore[type-arg]
    scripts, cluster, cap = case
    bound = lower_bound(scripts, cluster).bound_s
    shapes = [None, PoolShape.of({2: cluster.gpus // 2})]
    config = SimConfig(max_trajectories_per_engine=cap or None)
    for name in POLICIES:
        for shape in shapes:
            sim = Simulator(
                scripts, cluster, get_policy(name), tool_means_s={"sandbox": 0.41},
                history=history_of(scripts), config=config, shape=shape,
            )  # fmt: skip
            makespan = sim.run().makespan_s
            assert makespan >= bound * (1 - 1e-9), (name, shape, makespan, bound)


def test_kv_capacity_tightens_the_work_bound() -> None:
    """Long contexts on TP1: the KV cache holds a few of them, far below the batch cap."""
    spec = replace(
        load_workload("coding"), prompts=16, samples_per_prompt=8,
        prompt_tokens=replace(load_workload("coding").prompt_tokens, median=30_000.0,
                              maximum=40_000.0),
    )  # fmt: skip
    scripts = generate(spec, 3)
    tp1 = ClusterSpec("tp1", 8, 8, "qwen3-14b", "h100-sxm", (1,), 1)
    capped = replace(tp1, batch_cap=1_000)
    # With the KV cache binding, a larger batch cap cannot lower the bound.
    assert lower_bound(scripts, capped).work_s >= 0.99 * lower_bound(scripts, tp1).work_s
    tiny_cap = replace(tp1, batch_cap=1)
    assert lower_bound(scripts, tiny_cap).work_s > 2 * lower_bound(scripts, tp1).work_s
