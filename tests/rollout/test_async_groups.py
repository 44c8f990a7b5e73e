"""Finished groups streamed to a trainer, the quota stop and the carry-over (docs/async.md).

The session runs on real ``heddle worker --engine sim`` processes over HTTP; the
trainer takes batches in process (``session.groups``) and over the trainer API.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from heddle.api import AsynchronySpec, WeightsSpec
from heddle.client import TrainerClient
from heddle.rollout import Batch, LocalPool, TrainerServer
from heddle.worker import WorkerEndpoint

from .._rollout_fixtures import read_records
from ..worker.test_weights import fake_checkpoint
from .test_session import _session, _synthetic


def _check_batches(batches: list[Batch], records: list[dict], tasks: int, samples: int) -> None:
    # Nothing lost or duplicated: every (task, sample) once in the output, and the
    # trainer got every group once, whole, in batches of the quota.
    keys = [(r["task_id"], r["sample"]) for r in records]
    assert len(keys) == tasks * samples == len(set(keys))
    taken = [g.task_id for b in batches for g in b.groups]
    assert len(taken) == tasks == len(set(taken))
    for b in batches:
        for g in b.groups:
            assert [r["sample"] for r in g.records] == list(range(samples))
    # The output holds what the trainer took, in the order it took it.
    assert [r["task_id"] for r in records] == [t for t in taken for _ in range(samples)]
    # Completion order: each batch's groups completed before the next batch's.
    places = [g.completed for b in batches for g in b.groups]
    assert all(p >= 0 for p in places)


def test_quota_batches_carry_the_tail_over_within_the_bound(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    versions = [WeightsSpec(fake_checkpoint(tmp_path / f"v{n}"), str(n)) for n in range(3)]
    tasks, env = _synthetic(6, 2, tool_scale=0.3)
    out = tmp_path / "out.jsonl"
    spec = AsynchronySpec(max_staleness_versions=1, groups_per_iteration=2, over_sample=0.5)
    session = _session(workers, out, tasks, env, 2, weights=versions[0], asynchrony=spec)
    batches: list[Batch] = []
    running_at_take: list[int] = []

    async def trainer() -> None:
        run = asyncio.create_task(session.run())
        while (batch := await session.groups.next_batch()) is not None:
            batches.append(batch)
            state = session.groups.state()
            running_at_take.append(state["admitted"] - state["taken"])
            assert state["admitted"] - state["taken"] <= 3  # ceil(2 x 1.5) untaken at most
            if batch.iteration + 1 < len(versions):
                session.push_weights(versions[batch.iteration + 1])
        await run

    asyncio.run(trainer())
    records = read_records(out)
    _check_batches(batches, records, 6, 2)
    assert [len(b.groups) for b in batches] == [2, 2, 2] and batches[-1].last
    assert [b.weight_version for b in batches] == ["0", "1", "2"]
    # The bound holds for the trainer: no group it took was older than one push.
    assert max(g.staleness for b in batches for g in b.groups) <= 1
    order = {"0": 0, "1": 1, "2": 2}
    for r in records:
        steps = [order[s["weight_version"]] for s in r["segments"]]
        assert steps == sorted(steps)
    # Over-sampling: a third group ran beside the first batch and carried over.
    assert running_at_take[0] >= 1
    report = session.groups.lengths()
    assert report.trained == report.started == 12


def test_trainer_api_streams_batches_and_takes_pushes(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    versions = [fake_checkpoint(tmp_path / f"v{n}") for n in range(3)]
    tasks, env = _synthetic(4, 2, tool_scale=0.3)
    out = tmp_path / "out.jsonl"
    spec = AsynchronySpec(max_staleness_versions=1, groups_per_iteration=2, over_sample=0.5)
    session = _session(
        workers, out, tasks, env, 2, weights=WeightsSpec(versions[0], "0"), asynchrony=spec
    )
    got: list[dict] = []

    async def go() -> None:
        server = TrainerServer(session, token="secret")
        url = await server.start()
        run = asyncio.create_task(session.run())
        try:
            async with TrainerClient(url, token="secret") as client:
                n = 0
                while (batch := await client.next_batch()) is not None:
                    got.append(batch)
                    n += 1
                    if n < 3:
                        await client.push_weights(versions[n], str(n))
                state = await client.state()
                assert state["taken"] == 4 and state["lengths"]["trained"] == 8
            await run
        finally:
            await server.stop()

    asyncio.run(go())
    assert [b["weight_version"] for b in got] == ["0", "1"]
    assert [len(b["groups"]) for b in got] == [2, 2] and got[-1]["last"]
    assert max(g["staleness"] for b in got for g in b["groups"]) <= 1
    records = read_records(out)
    assert len({(r["task_id"], r["sample"]) for r in records}) == len(records) == 8


def test_without_a_quota_groups_stream_as_they_complete(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    tasks, env = _synthetic(4, 3, tool_scale=0.2)
    out = tmp_path / "out.jsonl"
    session = _session(workers, out, tasks, env, 3)
    groups = []

    async def go() -> None:
        session.groups.follow()
        run = asyncio.create_task(session.run())
        while (group := await session.groups.next_group()) is not None:
            # Whole when taken, and already in the output (no quota: written as finished).
            assert len(group.records) == 3
            assert len(read_records(out)) >= 3 * (len(groups) + 1)
            groups.append(group)
        await run

    asyncio.run(go())
    assert sorted(g.task_id for g in groups) == sorted(t.id for t in tasks)
    assert [g.completed for g in groups] == list(range(4))


def test_over_sample_needs_a_quota_and_both_are_parsed() -> None:
    import jsonschema

    from heddle.api import RolloutJobSpec
    from heddle.exceptions import ManifestError

    from ..api.test_manifests import JOB, _with
    from ..operator._cluster import validate

    bad = _with(JOB, "spec.asynchrony", {"overSample": 0.5})
    with pytest.raises(ManifestError, match=r"overSample needs .*groupsPerIteration"):
        RolloutJobSpec.from_manifest(bad)
    with pytest.raises(jsonschema.ValidationError, match="overSample needs groupsPerIteration"):
        validate("rolloutjobs", bad)
    good = _with(JOB, "spec.asynchrony", {"groupsPerIteration": 4, "overSample": 0.25})
    validate("rolloutjobs", good)
    assert RolloutJobSpec.from_manifest(good).asynchrony == AsynchronySpec(
        1, "restart", groups_per_iteration=4, over_sample=0.25
    )
    with pytest.raises(ManifestError, match="groupsPerIteration"):
        RolloutJobSpec.from_manifest(_with(JOB, "spec.asynchrony", {"groupsPerIteration": 0}))
