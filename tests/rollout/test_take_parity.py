"""The live trainer's take and the simulator's are one decision (docs/async.md).

The same finished sequence (groups in completion order, each member with the weight
version of its first step, and the trainer's takes in between) goes to the
simulator's trainer (:class:`IterationSimulator`, its finished buffer and its take)
and to the live :class:`GroupStream` (the session's ``finished``/``written`` hooks,
fed real :class:`TrajectoryRun` records). Both hand the trainer the same groups in
the same order: oldest version first under ``heddle`` (heddle.scheduler's
``take_oldest``), completion order under the baselines.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import replace

import pytest

from heddle.api import AsynchronySpec
from heddle.rollout import (
    FinishedGroup,
    GroupStream,
    OutputRecord,
    SyntheticEnvironment,
    Task,
    TrajectoryRun,
    load_cluster,
    synthetic_tasks,
)
from heddle.scheduler import Trajectory, TrajectoryScript, get_policy
from heddle.scheduler.sim import IterationSimulator, iteration_policy

from .test_session import WORKLOAD

SAMPLES, PUSHES = 2, 3  # versions v0..v3 were pushed, v3 is served now
# (group, the place of each sample's first-step version), in completion order.
FINISHED = [
    (2, (1, 1)),
    (0, (2, 3)),
    (5, (0, 1)),
    (1, (1, 2)),
    (4, (3, 0)),  # its older member decides
    (3, (2, 2)),
    (6, (1, 1)),
    (7, (0, 3)),
]
# The trainer's takes: a batch of 3 after the first five finish, one group, then the rest.
EVENTS: list[tuple[str, int]] = [
    *(("finish", g) for g, _ in FINISHED[:5]),
    ("take", 3),
    ("take", 1),
    *(("finish", g) for g, _ in FINISHED[5:]),
    ("take", 3),
    ("take", 1),
]
GROUPS = len(FINISHED)


def _simulated(policy: str) -> list[list[int]]:
    """The simulator's takes: its finished buffer filled in the same completion order."""
    scripts = [
        [TrajectoryScript(f"g{g}-{s}", f"g{g}", s, 8, (4,), (), (), ()) for s in range(SAMPLES)]
        for g in range(GROUPS)
    ]
    sim = IterationSimulator(
        scripts,
        replace(load_cluster("64xh100"), gpus=8),
        iteration_policy(policy, 1),
        batch_groups=3,
        iterations=1,
        max_staleness=1,
        tool_means_s={},
        rollout_tp=4,
    )
    versions = dict(FINISHED)
    takes = []
    for kind, arg in EVENTS:
        if kind == "finish":
            for s, place in enumerate(versions[arg]):
                sim.first_version[f"g{arg}-{s}"] = place
            sim.buffer.append(arg)  # as a group's last member finishing appends it
        else:
            takes.append(sim._take(arg))
    assert not sim.buffer
    return takes


@functools.cache
def _job() -> tuple[list[Task], SyntheticEnvironment]:
    return synthetic_tasks(GROUPS, WORKLOAD, seed=0), SyntheticEnvironment(
        WORKLOAD, GROUPS, SAMPLES, seed=0
    )


def _run(task_index: int, sample: int, first: int) -> TrajectoryRun:
    tasks, env = _job()
    tid = f"t-{task_index}-{sample}"
    run = TrajectoryRun(
        Trajectory(tid, f"g{task_index}", prompt_tokens=0),
        tasks[task_index],
        task_index,
        sample,
        env.episode(tasks[task_index], task_index, sample, tid),
    )
    # Its first step on version `first`, the next on the one served now.
    run.segments = [(f"v{first}", 0, 4), (f"v{PUSHES}", 4, 8)]
    return run


def _stream(policy: str, quota: int | None) -> tuple[GroupStream, list[OutputRecord]]:
    written: list[OutputRecord] = []

    def write(run: TrajectoryRun) -> OutputRecord:
        record = run.record(policy=policy, want_logprobs=False)
        written.append(record)
        return record

    places = {f"v{n}": n for n in range(PUSHES + 1)}
    spec = (
        None
        if quota is None
        else AsynchronySpec(5, "finish", groups_per_iteration=quota, over_sample=1.0)
    )
    stream = GroupStream(
        spec,
        write=write,
        drop=lambda run, reason: None,
        place=lambda v: None if v is None else places.get(v),
        pushes=lambda: PUSHES,
        version=lambda: f"v{PUSHES}",
        oldest_first=get_policy(policy).version_age,
    )
    stream.begin(dict.fromkeys(range(GROUPS), SAMPLES))
    stream.follow()
    return stream, written


def _write_now(run: TrajectoryRun, policy: str, written: list[OutputRecord]) -> OutputRecord:
    """Without a quota the session writes a record as its trajectory finishes."""
    record = run.record(policy=policy, want_logprobs=False)
    written.append(record)
    return record


async def _live(policy: str, quota: int | None) -> list[list[FinishedGroup]]:
    """The live stream's takes: a batch (``next_batch``) or one group (``next_group``)."""
    stream, written = _stream(policy, quota)
    versions = dict(FINISHED)
    takes: list[list[FinishedGroup]] = []
    for kind, arg in EVENTS:
        if kind == "finish":
            for s, first in enumerate(versions[arg]):
                run = _run(arg, s, first)
                if stream.holds:
                    assert stream.finished(run) is not None  # held until its group is taken
                else:
                    stream.written(run, _write_now(run, policy, written))
        elif arg == 1:
            group = await stream.next_group(timeout_s=1.0)
            assert group is not None
            takes.append([group])
        else:
            if quota is None:  # no batches without a quota: the same groups one by one
                groups = [await stream.next_group(timeout_s=1.0) for _ in range(arg)]
                takes.append([g for g in groups if g is not None])
                continue
            batch = await stream.next_batch(timeout_s=1.0)
            assert batch is not None
            takes.append(list(batch.groups))
    assert stream.ended
    # What was written (with a quota: as taken) is every member once.
    assert sorted((r["task_index"], r["sample"]) for r in written) == [
        (g, s) for g in range(GROUPS) for s in range(SAMPLES)
    ]
    return takes


def _indices(takes: Sequence[Sequence[FinishedGroup]]) -> list[list[int]]:
    return [[g.task_index for g in take] for take in takes]


@pytest.mark.parametrize("quota", [3, None], ids=["quota", "no-quota"])
@pytest.mark.parametrize("policy", ["heddle", "slime"])
def test_the_live_stream_takes_what_the_simulator_takes(policy: str, quota: int | None) -> None:
    simulated = _simulated(policy)
    live = asyncio.run(_live(policy, quota))
    assert _indices(live) == simulated
    completion = [g for g, _ in FINISHED]
    takes = [g for take in live for g in take]
    # `completed` still says each group's place in completion order.
    assert all(g.completed == completion.index(g.task_index) for g in takes)
    if policy == "heddle":
        # Oldest first: the first batch holds both version-0 groups of the five finished.
        assert simulated == [[5, 4, 2], [1], [7, 6, 0], [3]]
        assert [g.staleness for g in live[0]] == [PUSHES, PUSHES, PUSHES - 1]
    else:
        assert simulated == [[2, 0, 5], [1], [4, 3, 6], [7]]  # completion order


@pytest.mark.parametrize("policy", ["heddle", "slime"])
def test_a_release_writes_the_complete_groups_in_take_order(policy: str) -> None:
    """A trainer that releases the stream with groups complete and untaken: the held records
    go out in the order it would have taken them (oldest version first under ``heddle``,
    completion order under the baselines), not in completion order for every policy."""

    async def release() -> list[int]:
        stream, written = _stream(policy, 3)
        for group, firsts in FINISHED:
            for s, first in enumerate(firsts):
                assert stream.finished(_run(group, s, first)) is not None
        assert not written  # held: a quota is set and no group was taken
        stream.release()
        assert stream.ended
        return [int(r["task_index"]) for r in written[::SAMPLES]]

    order = asyncio.run(release())
    if policy == "heddle":
        # Version 0 (5, 4, 7), then 1 (2, 1, 6), then 2 (0, 3); completion order among equals.
        assert order == [5, 4, 7, 2, 1, 6, 0, 3]
    else:
        assert order == [g for g, _ in FINISHED]
