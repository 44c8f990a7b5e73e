"""The dynamic resource manager in the simulator: engines merge for the tail within budget."""

from __future__ import annotations

from dataclasses import replace

import pytest

from heddle.rollout import load_cluster, load_workload
from heddle.scheduler import (
    ClusterSpec,
    PoolShape,
    TailMergeConfig,
    TrajectoryScript,
    generate,
    get_policy,
)
from heddle.scheduler.sim import SimConfig, SimResult, Simulator

SHAPE = PoolShape.of({2: 4})  # four TP2 engines: pairs can merge into TP4
# Merge as soon as the per-iteration gain allows, whatever is left; a 30 s restart.
EAGER = TailMergeConfig(reshape_s=30.0, min_remaining_factor=0.0, max_pool_occupancy=1.0)


@pytest.fixture(scope="module")
def scripts() -> list[TrajectoryScript]:
    """A scaled-down coding workload: 12 prompts x 8 samples."""
    return generate(replace(load_workload("coding"), prompts=12, samples_per_prompt=8), 3)


@pytest.fixture(scope="module")
def cluster() -> ClusterSpec:
    """The paper's cluster cut to one 8-GPU node."""
    return replace(load_cluster("64xh100"), gpus=8)


def _run(
    scripts: list[TrajectoryScript], cluster: ClusterSpec, policy: str, merge: TailMergeConfig
) -> tuple[Simulator, SimResult]:
    sim = Simulator(
        scripts,
        cluster,
        get_policy(policy),
        tool_means_s={"sandbox": 0.41},
        shape=SHAPE,
        config=SimConfig(tail_merge=merge),
    )
    return sim, sim.run()


@pytest.fixture(scope="module")
def eager(scripts: list[TrajectoryScript], cluster: ClusterSpec) -> tuple[Simulator, SimResult]:
    """heddle-dynamic with merges made eagerly, so that the small workload has some."""
    return _run(scripts, cluster, "heddle-dynamic", EAGER)


def _spans(sim: Simulator) -> list[tuple[float, float, int]]:
    """(start, end, tp) of every engine: initial ones from 0, merged ones from when served."""
    served = iter(s for _, s, _ in sim.merges)
    initial = len(SHAPE.tps())
    out = []
    for i, (name, engine) in enumerate(sim.engines.items()):
        start = 0.0 if i < initial else next(served)
        out.append((start, sim.retired_at.get(name, float("inf")), engine.instance.tp))
    return out


def test_merges_keep_every_token_once_and_never_exceed_the_gpu_budget(
    eager: tuple[Simulator, SimResult], scripts: list[TrajectoryScript], cluster: ClusterSpec
) -> None:
    sim, result = eager
    assert sim.merges, "the eager settings should merge at least once"
    for script in scripts:
        state = sim.sims[script.id]
        assert state.finish_s is not None
        assert state.traj.generated_tokens == script.total_tokens
    generated = sum(e.generated_tokens for e in sim.engines.values())
    assert generated == sum(s.total_tokens for s in scripts) == result.tokens
    # A merged engine serves only once both engines it replaces are gone, plus the restart.
    for started, served, merge in sim.merges:
        freed = max(sim.retired_at[name] for name in merge.engines)
        assert started <= freed
        assert served == pytest.approx(freed + EAGER.reshape_s)
    # The GPUs in use, checked at every moment an engine starts or goes.
    spans = _spans(sim)
    for when in sorted({start for start, _, _ in spans} | set(sim.retired_at.values())):
        in_use = sum(tp for start, end, tp in spans if start <= when < end)
        assert in_use <= cluster.gpus, when


def test_the_result_counts_the_merges_as_reshapes(eager: tuple[Simulator, SimResult]) -> None:
    sim, result = eager
    assert result.reshapes == len(sim.merges) >= 1
    assert {e.instance.tp for e in sim.engines.values()} == {2, 4}


def test_without_a_merge_it_is_exactly_heddle(
    scripts: list[TrajectoryScript], cluster: ClusterSpec
) -> None:
    never = TailMergeConfig(min_speedup=0.99)
    dynamic, a = _run(scripts, cluster, "heddle-dynamic", never)
    plain, b = _run(scripts, cluster, "heddle", never)
    assert not dynamic.merges
    assert dynamic.finish_times() == plain.finish_times()
    assert replace(a, policy="heddle", scheduling="heddle") == b
