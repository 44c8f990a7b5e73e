"""Migration: only during tool calls, worth its cost, one move per sender and receiver."""

from __future__ import annotations

from heddle.scheduler import (
    MigrationConfig,
    NoMigration,
    PerfModel,
    ToolWindowMigration,
    Trajectory,
    TrajectoryState,
)

NOW = 100.0


def traj(
    tid: str, at: str, state: TrajectoryState, remaining: float, tool_left: float = 1.0
) -> Trajectory:
    t = Trajectory(tid, "g", 500, state=state, instance=at, context_tokens=4000)
    t.predicted_remaining_tokens = remaining
    t.tool_expected_end_s = NOW + tool_left
    return t


def setup(perf: PerfModel) -> tuple[dict[str, object], dict[str, int]]:
    instances = {
        "tp1-a": perf.instance("tp1-a", 1),
        "tp1-b": perf.instance("tp1-b", 1),
        "tp4": perf.instance("tp4", 4),
        "tp4-b": perf.instance("tp4-b", 4),
    }
    load = {"tp1-a": 20, "tp1-b": 20, "tp4": 2, "tp4-b": 2}
    return instances, load


def test_moves_only_trajectories_that_are_in_a_tool_call(perf: PerfModel) -> None:
    instances, load = setup(perf)
    planner = ToolWindowMigration(perf)
    trajs = [
        traj("tool", "tp1-a", TrajectoryState.IN_TOOL, 20_000),
        traj("gen", "tp1-b", TrajectoryState.GENERATING, 20_000),
    ]
    moves = planner.plan(trajs, lambda t: "tp4", instances, load, NOW)  # type: ignore[arg-type]
    assert [m.trajectory_id for m in moves] == ["tool"]
    assert moves[0].source == "tp1-a" and moves[0].destination == "tp4"
    assert moves[0].hidden_s > 0 and moves[0].gain_s > moves[0].cost_s


def test_no_two_moves_share_a_sender_or_a_receiver(perf: PerfModel) -> None:
    instances, load = setup(perf)
    planner = ToolWindowMigration(perf)
    trajs = [
        traj(f"t{i}", "tp1-a" if i % 2 else "tp1-b", TrajectoryState.IN_TOOL, 30_000 - i)
        for i in range(6)
    ]
    targets = ["tp4", "tp4-b"]
    moves = planner.plan(
        trajs,
        lambda t: targets[int(t.id[1:]) % 2],
        instances,
        load,
        NOW,  # type: ignore[arg-type]
    )
    senders = [m.source for m in moves]
    receivers = [m.destination for m in moves]
    assert len(set(senders)) == len(senders) and len(set(receivers)) == len(receivers)
    assert len(moves) == 2
    assert moves[0].trajectory_id == "t0"  # longest predicted first
    busy = planner.plan(trajs, lambda t: "tp4", instances, load, NOW, busy={"tp4"})  # type: ignore[arg-type]
    assert busy == []


def test_short_remaining_work_is_not_worth_a_move(perf: PerfModel) -> None:
    instances, load = setup(perf)
    planner = ToolWindowMigration(perf, MigrationConfig(min_gain_s=1.0))
    trajs = [traj("short", "tp1-a", TrajectoryState.IN_TOOL, 20, tool_left=0.0)]
    assert planner.plan(trajs, lambda t: "tp4", instances, load, NOW) == []  # type: ignore[arg-type]


def test_draining_instances_are_emptied_whatever_the_gain(perf: PerfModel) -> None:
    instances, load = setup(perf)
    planner = ToolWindowMigration(perf)
    trajs = [traj("short", "tp4", TrajectoryState.IN_TOOL, 20)]
    moves = planner.plan(
        trajs,
        lambda t: "tp4",
        instances,
        load,
        NOW,
        draining={"tp4"},  # type: ignore[arg-type]
    )
    assert len(moves) == 1 and moves[0].destination != "tp4"


def test_baselines_never_migrate(perf: PerfModel) -> None:
    instances, load = setup(perf)
    trajs = [traj("tool", "tp1-a", TrajectoryState.IN_TOOL, 20_000)]
    assert NoMigration().plan(trajs, lambda t: "tp4", instances, load, NOW) == []  # type: ignore[arg-type]
