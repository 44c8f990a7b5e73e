"""Several RL iterations in the simulator: every policy trains whole groups, once each,
at the versions it claims; Heddle keeps the staleness bound and drops nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from heddle.exceptions import ConfigError
from heddle.rollout import load_bench_workload, load_cluster
from heddle.scheduler import VersionAgedOrdering
from heddle.scheduler.sim import (
    ITERATION_POLICIES,
    IterationSimulator,
    TrainerModel,
    iteration_policy,
    stream_of,
)

PROMPTS, GPUS, ITERATIONS = 8, 8, 3


@pytest.fixture(scope="module")
def stream() -> tuple[list, dict[str, float], tuple]:  # type: ignore[type-arg]
    draws = [load_bench_workload("math", 1 + k, PROMPTS) for k in range(ITERATIONS + 4)]
    return stream_of([d.scripts for d in draws]), dict(draws[0].tool_means_s), draws[0].history


def _run(name: str, stream: tuple, staleness: int = 1, **kw: object) -> IterationSimulator:  # type: ignore[type-arg]
    groups, means, history = stream
    cluster = replace(load_cluster("64xh100"), gpus=GPUS)
    sim = IterationSimulator(
        groups,
        cluster,
        iteration_policy(name, staleness, **kw),  # type: ignore[arg-type]
        batch_groups=PROMPTS,
        iterations=ITERATIONS,
        max_staleness=staleness,
        tool_means_s=means,
        rollout_tp=4,
        history=history,
    )
    sim.result = sim.run_iterations()  # type: ignore[attr-defined]
    return sim


@pytest.mark.parametrize("name", ITERATION_POLICIES)
def test_every_policy_trains_whole_finished_groups_once(name: str, stream: tuple) -> None:  # type: ignore[type-arg]
    kw = {"rollout_gpus": 4} if name in ("verl-async", "areal") else {}
    sim = _run(name, stream, **kw)
    result = sim.result  # type: ignore[attr-defined]
    trained = [g for g, _ in sim.trained_groups]
    assert len(trained) == len(set(trained)), "a group was trained twice"
    for g in trained:
        assert all(sim.sims[s].traj.state.name == "DONE" for s in sim.groups[g])
    assert result.trained_samples == ITERATIONS * PROMPTS * 16
    assert len(result.step_end_s) == ITERATIONS
    assert result.step_end_s == sorted(result.step_end_s)
    assert result.elapsed_s == result.step_end_s[-1]


@pytest.mark.parametrize("name", ["verl", "slime"])
def test_synchronous_trains_each_draw_whole_and_fresh(name: str, stream: tuple) -> None:  # type: ignore[type-arg]
    sim = _run(name, stream)
    result = sim.result  # type: ignore[attr-defined]
    assert result.staleness_max == 0 and result.crossed_versions == 0
    # The batches are the draws: iteration k trains draw k's groups (in completion order).
    assert sorted(g for g, _ in sim.trained_groups) == list(range(ITERATIONS * PROMPTS))
    assert all(v == g // PROMPTS for g, v in sim.trained_groups)


def test_heddle_keeps_the_bound_and_carries_the_tail(stream: tuple) -> None:  # type: ignore[type-arg]
    sim = _run("heddle", stream, over_sample=0.5)
    result = sim.result  # type: ignore[attr-defined]
    assert result.staleness_max <= 1 and result.samples_over_bound == 0
    # It launched more than it trained, and what it carried over kept its first version.
    assert sim.launched_groups > ITERATIONS * PROMPTS
    carried = [s for s, v in sim.first_version.items() if sim.last_version.get(s, v) != v]
    assert carried, "no trajectory crossed a weight version"
    for sid in carried:
        assert sim.last_version[sid] > sim.first_version[sid]


def test_heddle_orders_by_version_age_as_the_live_session_does(stream: tuple) -> None:  # type: ignore[type-arg]
    """The engines rank steps with heddle.scheduler.VersionAgedOrdering (the class the live
    session wraps its ordering in): a trajectory begun a version earlier runs first."""
    sim = _run("heddle", stream, over_sample=0.5)
    assert isinstance(sim.ordering, VersionAgedOrdering)
    assert all(e.priority == sim.ordering.priority for e in sim.engines.values())
    old, young = (sim.sims[s].traj for s in list(sim.first_version)[:2])
    sim.first_version[old.id], sim.first_version[young.id] = 0, sim.rollout_version
    old.predicted_remaining_tokens, young.predicted_remaining_tokens = 1.0, 1e6
    assert sim.rollout_version >= 1
    assert sim.ordering.priority(old) < sim.ordering.priority(young)
    assert not isinstance(_run("slime-partial", stream).ordering, VersionAgedOrdering)


def test_disaggregated_admission_stays_within_the_window(stream: tuple) -> None:  # type: ignore[type-arg]
    sim = _run("areal", stream, staleness=1, rollout_gpus=4)
    assert sim.launched_groups <= (sim.trained_versions + 2) * PROMPTS
    assert sim.trainer_gpus == GPUS - 4


def test_trainer_model_seconds_per_token() -> None:
    model = load_cluster("64xh100").perf_model().model
    t = TrainerModel()
    # 3,800 tokens/s/GPU at 13B; Qwen3-14B is 14.77B; x (1 + 2/3) for two extra forwards.
    assert t.seconds_per_token(model, 64) == pytest.approx(14.77 / 13 * (5 / 3) / (3800 * 64))
    assert t.train_s(1000, model, 32) == pytest.approx(2 * t.train_s(1000, model, 64))
    assert t.sync_s(model) == pytest.approx(2.0 + 14.77e9 * 2 / 25e9)


def test_bad_policies_say_what_to_fix() -> None:
    with pytest.raises(ConfigError, match="valid policies are"):
        iteration_policy("verl-fast", 1)
    with pytest.raises(ConfigError, match="rollout_gpus"):
        iteration_policy("areal", 1)
    with pytest.raises(ConfigError, match="max_staleness"):
        iteration_policy("heddle", -1)
