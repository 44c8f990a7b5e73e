"""The live session and the simulator take the same re-plan decisions.

One sequence of events (steps running, tool calls begun, predictions, an
engine draining) is applied to a real :class:`RolloutSession` and to a real
:class:`Simulator` over the same engines; each then runs its own re-plan step
(``RolloutSession._replan``, ``Simulator._replan``) and the plans and moves
must be identical. Both call :func:`heddle.scheduler.decide_replan`; what this
checks is that each maps its own state onto it alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from heddle.api import SamplingSpec, ToolsSpec
from heddle.rollout import OutputSink, RolloutSession, SessionConfig, Task, ToolsEnvironment
from heddle.rollout._record import TrajectoryRun
from heddle.scheduler import (
    ClusterSpec,
    DPPlacement,
    Move,
    PoolShape,
    Trajectory,
    TrajectoryScript,
    TrajectoryState,
    get_policy,
)
from heddle.scheduler.sim import SimConfig, Simulator
from heddle.worker import WorkerEndpoint


@dataclass(frozen=True)
class Tool:
    """A step of ``trajectory`` ended on ``engine``; it now waits on a tool until ``end_s``."""

    trajectory: str
    engine: int  # index into the engines, in the simulator's order
    remaining_tokens: float  # the predictor's estimate
    context_tokens: int
    end_s: float


@dataclass(frozen=True)
class Step:
    """``trajectory`` has a step queued or generating on ``engine``."""

    trajectory: str
    engine: int
    remaining_tokens: float
    context_tokens: int


@dataclass(frozen=True)
class Drain:
    engine: int


Event = Tool | Step | Drain

# Long and short trajectories in two GRPO groups, mostly on engine 0, so the plan
# spreads them: moves off engine 0 while they wait on tools.
EVENTS: list[Event] = [
    *(Tool(f"g0-{i}", 0, 30000.0 - 2000 * i, 2000 + 100 * i, 30.0) for i in range(6)),
    *(Step(f"g1-{i}", 0, 200.0 + 10 * i, 500) for i in range(4)),
    *(Step(f"g2-{i}", 0, 100.0 + 10 * i, 500) for i in range(80)),
    Tool("g1-4", 1, 50.0, 300, 30.0),
    Step("g1-5", 2, 60.0, 400),
]
NOW_S = 10.0


def _ids(events: list[Event]) -> list[str]:
    return [e.trajectory for e in events if not isinstance(e, Drain)]


def _scripts(ids: list[str]) -> list[TrajectoryScript]:
    return [
        TrajectoryScript(tid, tid.split("-")[0], k, 100, (100, 100), ("t",), (1.0,), (10,))
        for k, tid in enumerate(ids)
    ]


def _cluster() -> ClusterSpec:
    return ClusterSpec("c", 4, 4, "qwen3-8b", "h100-sxm", (1, 2), 1)


def _simulator(events: list[Event]) -> Simulator:
    sim = Simulator(
        _scripts(_ids(events)),
        _cluster(),
        get_policy("heddle"),
        tool_means_s={"t": 1.0},
        shape=PoolShape.of([2, 1, 1]),
        config=SimConfig(planner_cost=None),
    )
    names = list(sim.engines)
    for event in events:
        if isinstance(event, Drain):
            sim._draining.add(names[event.engine])
            sim._live_view = sim._build_view()
            continue
        s = sim.sims[event.trajectory]
        s.traj.predicted_remaining_tokens = event.remaining_tokens
        s.traj.context_tokens = event.context_tokens
        s.traj.instance = names[event.engine]
        engine = sim.engines[names[event.engine]]
        if isinstance(event, Tool):
            s.traj.state = TrajectoryState.IN_TOOL
            s.traj.tool_expected_end_s = event.end_s
            engine.keep(s)
        else:
            engine.enqueue(s, 0.0)
    return sim


def _session(events: list[Event], sim: Simulator, tmp: Path) -> RolloutSession:
    """A session on workers named and sized as the simulator's engines, same performance model."""
    environment = ToolsEnvironment(ToolsSpec())
    names = list(sim.engines)
    tps = [sim.engines[n].instance.tp for n in names]
    session = RolloutSession(
        job="j",
        tasks=[Task("t", ({"role": "user", "content": "q"},))],
        samples_per_task=1,
        environment=environment,
        workers=[WorkerEndpoint(n, f"http://{n}", tp) for n, tp in zip(names, tps, strict=True)],
        sink=OutputSink(tmp / "out.jsonl"),
        perf=sim.perf,
        sampling=SamplingSpec(),
        max_turns=2,
        config=SessionConfig(),
    )
    task = session.tasks[0]
    scripts = {
        s.id: s for s in _scripts([e.trajectory for e in events if not isinstance(e, Drain)])
    }
    for event in events:
        if isinstance(event, Drain):
            session.drain_worker(names[event.engine])
            continue
        script = scripts[event.trajectory]
        traj = Trajectory(script.id, script.group_id, script.prompt_tokens)
        run = TrajectoryRun(traj, task, 0, script.sample, environment.episode(task, 0, 0, traj.id))
        session.runs[traj.id] = run
        traj.predicted_remaining_tokens = event.remaining_tokens
        traj.context_tokens = event.context_tokens
        name = names[event.engine]
        traj.instance = run.resident = name
        if isinstance(event, Tool):
            traj.state = TrajectoryState.IN_TOOL
            traj.tool_expected_end_s = event.end_s
        else:
            traj.state = TrajectoryState.GENERATING
            session._load[name] += 1
    session._started = 0.0  # its clock reads NOW_S (time.monotonic is patched by the test)
    return session


def _decide(
    events: list[Event], tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[tuple[Move, ...], list[Move], dict[str, str], dict[str, str]]:
    sim = _simulator(events)
    session = _session(events, sim, tmp)
    monkeypatch.setattr("heddle.rollout._session.time.monotonic", lambda: NOW_S)
    session_moves = session._replan()
    started: list[Move] = []
    monkeypatch.setattr(sim, "_start_move", lambda move, now: started.append(move))
    sim._replan(NOW_S)
    assert isinstance(session.placement, DPPlacement)
    assert isinstance(sim.placement, DPPlacement)
    return (
        session_moves,
        started,
        dict(session.placement.plan.assignment),
        dict(sim.placement.plan.assignment),
    )


def test_the_session_and_the_simulator_plan_and_move_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_moves, sim_moves, session_plan, sim_plan = _decide(EVENTS, tmp_path, monkeypatch)
    assert session_plan == sim_plan
    assert len(session_plan) == 92  # every unfinished trajectory is planned
    assert list(session_moves) == sim_moves
    assert sim_moves, "the scenario must make the planner move something"


def test_a_draining_engine_is_emptied_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = [*EVENTS, Drain(1)]
    session_moves, sim_moves, session_plan, sim_plan = _decide(events, tmp_path, monkeypatch)
    assert session_plan == sim_plan
    assert list(session_moves) == sim_moves
    drained = [m for m in sim_moves if m.trajectory_id == "g1-4"]
    assert drained, sim_moves  # the one in a tool call on the draining engine leaves it
    assert all(m.destination != drained[0].source for m in sim_moves)
