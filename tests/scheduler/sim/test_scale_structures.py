"""The simulator's scale structures answer as the scans they replaced, and the planner's
CPU-time charge delays what it should and nothing else."""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.scheduler import (
    HEDDLE_SPECULATION,
    ClusterSpec,
    PoolShape,
    SpeculationConfig,
    Trajectory,
    TrajectoryScript,
    WorkloadSpec,
    acceptance_model,
    generate,
    get_policy,
    history_of,
)
from heddle.scheduler.sim import (
    MIN_PARALLEL_TRAJECTORIES,
    PlannerCost,
    SimConfig,
    SimEngine,
    SimSpeculation,
    SimTrajectory,
    Simulator,
    Wave,
    _minis,
    heddle_speculation,
    wave_events,
    wave_workers,
)
from heddle.scheduler.sim._view import LoadIndex

# -- LoadIndex against min/max over a list ------------------------------------------------


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=40),
    st.lists(st.tuples(st.integers(0, 39), st.integers(-2, 2)), max_size=200),
)
def test_load_index_agrees_with_a_scan(loads: list[int], steps: list[tuple[int, int]]) -> None:
    index = LoadIndex(loads)
    current = list(loads)
    for step, delta in steps:
        pos = step % len(current)
        current[pos] = max(0, current[pos] + delta)
        index.set(pos, current[pos])
        assert index.argmin() == min(range(len(current)), key=lambda i: (current[i], i))
        assert index.min() == min(current)
        assert index.max() == max(current)
        assert [index.load(i) for i in range(len(current))] == current


# -- lazy crediting against the eager scan ------------------------------------------------


class _EagerEngine(SimEngine):
    """The O(batch) scan the heap replaced: every running request credited at each end."""

    def finish_segment(self, now: float) -> list[SimTrajectory]:
        seg = self.segment
        self.segment = None
        if seg is None:
            return []
        self.busy_s += seg.end_s - seg.start_s
        self.busy_intervals.append((seg.start_s, seg.end_s))
        done: list[SimTrajectory] = []
        n = seg.iterations
        if n:
            for sim in self.running.values():
                sim.remaining_in_turn -= n
                sim.traj.context_tokens += n
                sim.traj.generated_tokens += n
                if sim.remaining_in_turn <= 0:
                    done.append(sim)
            self.running_context += n * len(self.running)
            self.generated_tokens += n * len(self.running)
        for sim in done:
            self._stop(sim)  # the engine's clock never moves, so nothing is credited twice
        return done

    def _fewest_left(self) -> int:
        return min(s.remaining_in_turn for s in self.running.values())


def _drive(
    engine_type: type[SimEngine],
    scripts: list[TrajectoryScript],
    cluster: ClusterSpec,
    cuts: list[float],
) -> list[object]:
    """Run scripts through one engine (tools answer at once); log what can be observed."""
    perf = cluster.perf_model()
    engine = engine_type(perf.instance("e", 1), perf, lambda t: -float(t.prompt_tokens))
    sims = [SimTrajectory(s, Trajectory(s.id, s.group_id, s.prompt_tokens)) for s in scripts]
    now, log, k = 0.0, [], 0
    for sim in sims:
        sim.start_turn()
        engine.enqueue(sim, now)
    while (end := engine.start_segment(now)) is not None:
        cut = cuts[k % len(cuts)] if cuts else 1.0
        k += 1
        if cut < 1.0:
            end = engine.cut_segment(now + cut * (end - now)) or end
        now = end
        done = engine.finish_segment(now)
        log.append((now, [s.id for s in done], engine.running_context, engine.generated_tokens))
        for sim in done:
            traj = sim.traj
            traj.turns += 1
            log.append((sim.id, traj.generated_tokens, traj.context_tokens, sim.remaining_in_turn))
            if traj.turns < sim.script.turns:
                engine.keep(sim)
                sim.start_turn()
                engine.enqueue(sim, now)
        engine.relieve_kv_pressure(now)
        log.append((engine.preemptions, engine.load, sorted(engine.running)))
    assert all(s.traj.generated_tokens == s.script.total_tokens for s in sims)
    return log


_script = st.builds(
    lambda i, prompt, turns: TrajectoryScript(
        f"t{i}",
        "g",
        0,
        prompt,
        tuple(turns),
        ("x",) * (len(turns) - 1),
        (0.0,) * (len(turns) - 1),
        (0,) * (len(turns) - 1),
    ),
    st.integers(0, 10**6),
    st.integers(1, 4000),
    # A few common lengths: steps that end in the same iteration (their order matters).
    st.lists(st.sampled_from([40, 400, 1500]) | st.integers(1, 2500), min_size=1, max_size=4),
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    st.lists(_script, min_size=1, max_size=10, unique_by=lambda s: s.id),
    st.sampled_from([1, 3, 100]),
    st.lists(st.one_of(st.just(1.0), st.floats(0.0, 0.99)), max_size=8),
)
def test_lazy_crediting_agrees_with_the_eager_scan(
    scripts: list[TrajectoryScript], batch_cap: int, cuts: list[float]
) -> None:
    # Qwen3-32B on one H100 keeps ~13K tokens of KV: these contexts preempt each other.
    tight = ClusterSpec("tight", 1, 1, "qwen3-32b", "h100-sxm", (1,), 1, batch_cap=batch_cap)
    assert _drive(SimEngine, scripts, tight, cuts) == _drive(_EagerEngine, scripts, tight, cuts)


# -- the planner's CPU time ---------------------------------------------------------------


def _preset(name: str) -> Any:
    text = resources.files("heddle.scheduler").joinpath("presets", name).read_text("utf-8")
    return yaml.safe_load(text)


_CODING = replace(WorkloadSpec.from_dict(_preset("coding.yaml")), prompts=12, samples_per_prompt=8)
_NODE = replace(ClusterSpec.from_dict(_preset("cluster-64xh100.yaml")), gpus=8)
_MIXED = PoolShape.of({1: 4, 2: 2})


def _run(policy: str, cost: PlannerCost | None) -> tuple[Simulator, tuple[object, ...]]:
    sim = Simulator(
        generate(_CODING, 5),
        _NODE,
        get_policy(policy),
        tool_means_s={"sandbox": 0.41},
        history=history_of(generate(_CODING, 6)),
        shape=_MIXED,
        config=SimConfig(planner_cost=cost),
    )
    r = sim.run()
    return sim, (r.makespan_s, r.tokens, r.events, r.migrations, tuple(r.completion_s))


def test_a_free_planner_changes_nothing() -> None:
    free = PlannerCost(0.0, 0.0, 0.0, 0.0, 0.0)
    assert _run("heddle-migrate", free)[1] == _run("heddle-migrate", None)[1]


def test_baselines_plan_nothing_and_pay_nothing() -> None:
    sim, charged = _run("verl-star", PlannerCost())
    assert sim.planner_s == 0.0
    assert charged == _run("verl-star", None)[1]


def test_the_first_steps_wait_for_the_first_plan() -> None:
    cost = PlannerCost(
        placement_fixed_s=2.0,
        placement_per_trajectory_s=0.0,
        placement_per_engine_s=0.0,
        migration_per_trajectory_s=0.0,
    )
    sim, _ = _run("heddle-migrate", cost)
    first = min(start for e in sim.engines.values() for start, _ in e.busy_intervals)
    assert first == 2.0
    # Every re-plan with work left pays the fixed cost; the last may find nothing to plan.
    assert sim.planner_s in (2.0 * (1 + sim.replans), 2.0 * sim.replans)


def _planned(
    cost: PlannerCost | None, speculation: SimSpeculation | None = None
) -> tuple[Simulator, float]:
    sim = Simulator(
        generate(_CODING, 5), _NODE, get_policy("heddle"), tool_means_s={"sandbox": 0.41},
        history=history_of(generate(_CODING, 6)),
        config=SimConfig(planner_cost=cost, speculation=speculation),
    )  # fmt: skip
    return sim, sim.run().decisions_s


def test_the_first_steps_wait_for_the_start_up_decisions() -> None:
    # Heddle plans its pool's shape before it routes a step: the planner's
    # mini-simulations of a replica are charged by the events they handled.
    sim, charged = _planned(PlannerCost(simulated_event_s=1e-3, speculating_event_s=5e-3))
    assert sim.decision_events > 0
    assert charged == pytest.approx(1e-3 * sim.decision_events)
    first = min(start for e in sim.engines.values() for start, _ in e.busy_intervals)
    assert first >= charged
    free, nothing = _planned(None)
    assert nothing == 0.0 and free.decision_events == sim.decision_events


def test_speculating_decisions_are_charged_at_their_own_rate() -> None:
    # A speculating mini-simulation groups every step's batch by what it drafts from:
    # its events cost about three times a plain one's (docs/simulator.md).
    spec = heddle_speculation(HEDDLE_SPECULATION, acceptance_model("default"))
    cost = PlannerCost(simulated_event_s=1e-3, speculating_event_s=5e-3)
    sim, charged = _planned(cost, spec)
    assert sim.decision_events > 0
    assert charged == pytest.approx(5e-3 * sim.decision_events)
    off = replace(spec, config=SpeculationConfig("off"))
    plain, charged_off = _planned(cost, off)
    assert charged_off == pytest.approx(1e-3 * plain.decision_events)


def test_a_wave_takes_its_longest_worker() -> None:
    # Runs go, in order, to the first free worker (a process pool's queue).
    assert wave_events(Wave((30, 50, 29), 1)) == 109
    assert wave_events(Wave((30, 50, 29), 2)) == 59  # 30 + 29 beside 50
    assert wave_events(Wave((30, 50, 29), 4)) == 50
    assert wave_events(Wave((50, 30, 30, 30), 2)) == 80  # 50 + 30 beside 30 + 30


def test_a_wave_of_small_runs_stays_in_one_process() -> None:
    big = MIN_PARALLEL_TRAJECTORIES
    assert wave_workers([big, big, big], 4) == 3  # one per run
    assert wave_workers([big] * 8, 4) == 4
    assert wave_workers([big, big - 1], 4) == 1  # a worker's start costs more
    assert wave_workers([big], 4) == 1
    assert wave_workers([big, big], 1) == 1


def test_decisions_on_workers_are_charged_by_their_waves(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every run counted as large enough for a worker: each wave then runs on up to four
    # processes, and the run waits for each wave's longest worker, plus their start.
    monkeypatch.setattr(_minis, "MIN_PARALLEL_TRAJECTORIES", 1)
    rates = {"simulated_event_s": 1e-3, "speculating_event_s": 5e-3, "worker_start_s": 0.25}
    one, alone = _planned(PlannerCost(**rates, decision_workers=1))
    four, beside = _planned(PlannerCost(**rates, decision_workers=4))
    assert four.decision_events == one.decision_events  # the same simulations
    assert [w.events for w in four.decision_waves] == [w.events for w in one.decision_waves]
    assert any(len(w.events) > 1 for w in four.decision_waves)
    assert alone == pytest.approx(1e-3 * one.decision_events)
    longest = sum(wave_events(w) for w in four.decision_waves)
    assert longest < one.decision_events
    assert beside == pytest.approx(1e-3 * longest + 0.25)
    first = min(start for e in four.engines.values() for start, _ in e.busy_intervals)
    assert beside <= first < alone  # routing starts once they are decided, sooner


@pytest.mark.slow
def test_a_charged_run_is_reproducible_and_loses_nothing() -> None:
    cost = PlannerCost(placement_fixed_s=0.3, migration_per_trajectory_s=1e-3)
    sim, first = _run("heddle-migrate", cost)
    assert _run("heddle-migrate", cost)[1] == first
    assert sim.planner_s > 0.3
    assert all(s.traj.generated_tokens == s.script.total_tokens for s in sim.sims.values())
    uncharged = _run("heddle-migrate", None)[1]
    assert first[1] == uncharged[1]  # the same tokens, generated later
    assert first != uncharged
