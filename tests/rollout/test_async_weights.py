"""New weights under a running rollout (docs/async.md): the session pushes them to every
worker, which finishes its steps, loads them in place and goes on; nothing is lost or
duplicated, and every record says, step by step, which version made which tokens.

The session runs on real ``heddle worker --engine sim`` processes over HTTP.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest

from heddle.api import WeightsSpec
from heddle.exceptions import ConfigError
from heddle.rollout import LocalPool, RolloutSession
from heddle.worker import WorkerEndpoint

from .._rollout_fixtures import read_records
from ..worker.test_weights import fake_checkpoint
from .test_session import FAST, _session, _synthetic
from .test_weights import _versions

# Starts sim worker processes for the module: not the inner loop (README).
pytestmark = pytest.mark.slow


def test_weights_pushed_mid_rollout_change_later_steps_only(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    v1, v2, v3 = (WeightsSpec(fake_checkpoint(tmp_path / f"step-{n}"), str(n)) for n in (1, 2, 3))
    tasks, env = _synthetic(8, 4, tool_scale=0.5)  # multi-turn, with tool gaps
    out = tmp_path / "out.jsonl"
    session = _session(workers, out, tasks, env, 4, weights=v1)
    pushed_at: list[int] = []

    async def go() -> None:
        run = asyncio.create_task(session.run())
        for spec in (v2, v3):
            while session._steps < 40 * (len(pushed_at) + 1) and not run.done():
                await asyncio.sleep(0.02)
            pushed_at.append(session._steps)
            session.push_weights(spec)
        await run

    asyncio.run(go())
    records = read_records(out)
    # Nothing lost or duplicated: one record per (task, sample), every one finished.
    keys = [(r["task_id"], r["sample"]) for r in records]
    assert len(keys) == 32 and len(set(keys)) == 32
    assert {r["status"] for r in records} == {"done"}
    order = {"1": 1, "2": 2, "3": 3}
    crossed = 0
    for r in records:
        segments = r["segments"]
        assert len(segments) == r["turns"]
        versions = [order[s["weight_version"]] for s in segments]
        assert versions == sorted(versions), "a step ran on older weights than the one before"
        assert r["weight_version"] == segments[0]["weight_version"]
        assert r["weight_versions"] == sorted(set(r["weight_versions"]), key=order.__getitem__)
        # The segments tile the generated tokens exactly (tool tokens between them).
        mask = r["response_mask"]
        covered = [i for s in segments for i in range(s["response_start"], s["response_end"])]
        assert covered == [i for i, m in enumerate(mask) if m == 1]
        crossed += len(set(versions)) > 1
    assert crossed > 0, "no trajectory ran across a weight push"
    assert {s["weight_version"] for r in records for s in r["segments"]} == {"1", "2", "3"}
    assert _versions(workers) == ["3", "3"]


def test_a_step_a_worker_refused_for_a_load_waits_for_it_and_is_no_failure(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    """Two steps in flight per worker, the rest queued in the session: after a push the
    first to finish lets a queued one go to a worker still settling for its load, which
    refuses it (503, loading). That is the session's own push, not the step's failure
    (here one failure would fail the trajectory), and the step is sent again once a worker
    serves the new weights, not after a back-off (here 5 s, doubling)."""
    _, workers = sim_pool
    v1, v2, v3 = (WeightsSpec(fake_checkpoint(tmp_path / f"step-{n}"), str(n)) for n in (1, 2, 3))
    tasks, env = _synthetic(8, 4, tool_scale=0.5)
    out = tmp_path / "out.jsonl"
    config = replace(FAST, max_inflight_per_worker=2, max_step_retries=0, retry_backoff_s=5.0)
    session = _session(workers, out, tasks, env, 4, weights=v1, config=config)

    async def go() -> float:
        run = asyncio.create_task(session.run())
        for n, spec in enumerate((v2, v3), start=1):
            while session._steps < 30 * n and not run.done():
                await asyncio.sleep(0.02)
            session.push_weights(spec)
        started = time.monotonic()
        await run
        return time.monotonic() - started

    took = asyncio.run(go())
    records = read_records(out)
    assert len({(r["task_id"], r["sample"]) for r in records}) == 32
    assert {r["status"] for r in records} == {"done"}, {r["error"] for r in records}
    # Steps were refused for the loads (else this test shows nothing) ...
    assert sum(run.retries for run in session.runs.values()) > 0
    # ... and none waited out a back-off: one 5 s wait per refused step would show.
    assert took < 5.0 * sum(run.retries for run in session.runs.values())
    assert _versions(workers) == ["3", "3"]


def test_pushing_weights_needs_a_job_with_weights(tmp_path: Path) -> None:
    tasks, env = _synthetic(1, 1)
    worker = WorkerEndpoint("w0", "http://127.0.0.1:9")  # never contacted: refused before
    session = _session([worker], tmp_path / "out.jsonl", tasks, env, 1)
    with pytest.raises(ConfigError, match=r"names no spec\.weights"):
        session.push_weights(WeightsSpec(str(tmp_path), "2"))


def test_asynchrony_is_parsed_defaulted_and_checked_by_the_crd() -> None:
    import jsonschema

    from heddle.api import AsynchronySpec, RolloutJobSpec
    from heddle.exceptions import ManifestError

    from ..api.test_manifests import JOB, _with
    from ..operator._cluster import validate

    job = _with(JOB, "spec.asynchrony", {"maxStalenessVersions": 2, "pastBound": "drop"})
    assert RolloutJobSpec.from_manifest(job).asynchrony == AsynchronySpec(2, "drop")
    assert RolloutJobSpec.from_manifest(_with(JOB, "spec.asynchrony", {})).asynchrony == (
        AsynchronySpec(1, "restart")
    )
    assert RolloutJobSpec.from_manifest(JOB).asynchrony is None
    validate("rolloutjobs", job)
    for bad, message in (
        ({"pastBound": "keep"}, "choose one of ['restart', 'finish', 'drop']"),
        ({"maxStalenessVersions": -1}, "maxStalenessVersions"),
        ({"overSample": 0.5}, "overSample"),
    ):
        with pytest.raises(ManifestError) as err:
            RolloutJobSpec.from_manifest(_with(JOB, "spec.asynchrony", bad))
        assert message in str(err.value)
    with pytest.raises(jsonschema.ValidationError):
        validate("rolloutjobs", _with(JOB, "spec.asynchrony", {"pastBound": "keep"}))


def test_trajectories_past_the_bound_follow_the_job(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    """Bound 0: a trajectory with a step on older weights than the last push restarts on
    the new ones, is dropped, or finishes on them, as the job's pastBound says."""
    from heddle.api import AsynchronySpec

    _, workers = sim_pool
    v1, v2 = (WeightsSpec(fake_checkpoint(tmp_path / f"step-{n}"), str(n)) for n in (1, 2))
    tasks, env = _synthetic(4, 4, tool_scale=0.5)
    for past_bound in ("restart", "drop", "finish"):
        out = tmp_path / f"{past_bound}.jsonl"
        session = _session(
            workers, out, tasks, env, 4, weights=v1, asynchrony=AsynchronySpec(0, past_bound)
        )

        async def go(session: RolloutSession = session) -> None:
            run = asyncio.create_task(session.run())
            while session.steps < 16 and not run.done():
                await asyncio.sleep(0.02)
            session.push_weights(v2)
            await run

        asyncio.run(go())
        records = read_records(out)
        keys = [(r["task_id"], r["sample"]) for r in records]
        assert len(keys) == 16 and len(set(keys)) == 16  # nothing lost or duplicated
        crossed = [r for r in records if len(r["weight_versions"]) > 1]
        dropped = [r for r in records if r["finish_reason"] == "past_bound"]
        restarted = [r for r in records if r["past_bound_restarts"]]
        if past_bound == "restart":
            assert session.past_bound_restarts == len(restarted) > 0
            assert crossed == [] and dropped == []
            assert all(r["weight_versions"] == ["2"] for r in restarted)
        elif past_bound == "drop":
            assert session.past_bound_drops == len(dropped) > 0
            # Dropped at the first step boundary that saw it past the bound.
            assert all(r["status"] == "failed" and r["weight_version"] == "1" for r in dropped)
            assert restarted == []
        else:
            assert crossed and dropped == [] and restarted == []
            assert all(r["weight_versions"] == ["1", "2"] for r in crossed)


def _admission_order(
    worker: WorkerEndpoint, policy: str, v1: WeightsSpec, v2: WeightsSpec, tmp_path: Path
) -> list[int]:
    """Six steps after a push, queued together at ``worker``'s admission window of one
    (held while they queue, then let go), each run on the worker serving ``v2``, one at a
    time: the order they finish in is the order the session admitted them. Samples 3-5
    began on ``v1`` and are predicted short; 0-2 are young and predicted long."""
    from dataclasses import replace

    from heddle.rollout._record import TrajectoryRun
    from heddle.scheduler import Trajectory

    from .test_session import FAST

    tasks, env = _synthetic(1, 6)
    config = replace(FAST, max_inflight_per_worker=1)
    out = tmp_path / f"{policy}.jsonl"
    session = _session([worker], out, tasks, env, 6, weights=v1, policy=policy, config=config)
    session.push_weights(v2)
    runs = []
    for sample in range(6):
        old = sample >= 3
        traj = Trajectory(f"age-{policy}-{sample}", "g", 10)
        traj.predicted_remaining_tokens = 100.0 if old else 5000.0 + sample
        run = TrajectoryRun(traj, tasks[0], 0, sample, env.episode(tasks[0], 0, sample, traj.id))
        run.pending = list(tasks[0].messages)
        if old:
            run.segments.append((v1.version, 0, 0))
        session.runs[traj.id] = run
        runs.append(run)
    sampling = {"max_tokens": 4, "temperature": 1.0, "top_p": 1.0, "ignore_eos": True}
    finished: list[int] = []

    async def go() -> None:
        session._connect(worker)
        try:
            await session._clients[worker.name].load_weights(v2.path, v2.version, timeout=30.0)
            window = session._windows[worker.name]
            await window.acquire(0)  # held while the six steps queue, young ones first

            async def step(k: int) -> None:
                await session._attempt(runs[k], worker.name, sampling)
                finished.append(k)

            steps = [asyncio.create_task(step(k)) for k in range(6)]
            while window.waiting < 6:
                await asyncio.sleep(0.01)
            window.release()
            await asyncio.gather(*steps)
        finally:
            await session._purge_workers()
            for http in session._pools.values():
                await http.aclose()

    asyncio.run(go())
    assert all(r.step_weight_version == v2.version for r in runs)
    return finished


def test_the_oldest_weight_version_steps_first(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    """After a push, heddle's session admits the steps of trajectories begun on the old
    version before those begun on the new one (heddle.scheduler.VersionAgedOrdering),
    whatever their predicted lengths; ``heddle-order`` (the same progressive priority
    without the age) runs the longest predicted first, here the young ones."""
    _, workers = sim_pool
    v1, v2 = (WeightsSpec(fake_checkpoint(tmp_path / f"step-{n}"), str(n)) for n in (1, 2))
    aged = _admission_order(workers[0], "heddle", v1, v2, tmp_path)
    assert sorted(aged[:3]) == [3, 4, 5], aged  # the old ones first, in any order
    plain = _admission_order(workers[0], "heddle-order", v1, v2, tmp_path)
    assert plain == [2, 1, 0, 3, 4, 5], plain  # longest predicted first, then FIFO


@pytest.mark.parametrize("policy", ["heddle", "heddle-order"])
def test_a_push_unpins_trajectories_whose_kv_it_dropped(policy: str, tmp_path: Path) -> None:
    """Heddle routes a trajectory whose last step ran on weights older than the ones served
    as a new one (heddle.scheduler.unpinned): the load dropped its KV, so it goes to the
    least-loaded worker; one that stepped on the new weights, and every trajectory under
    a policy without version age, stays where its context is."""
    from heddle.rollout._record import TrajectoryRun
    from heddle.scheduler import Trajectory, VersionAgedOrdering

    tasks, env = _synthetic(1, 2)
    workers = [WorkerEndpoint(n, "http://127.0.0.1:9") for n in ("w0", "w1")]  # never called
    v1, v2 = (WeightsSpec(fake_checkpoint(tmp_path / f"step-{n}"), str(n)) for n in (1, 2))
    session = _session(workers, tmp_path / "out.jsonl", tasks, env, 2, weights=v1, policy=policy)
    assert isinstance(session.ordering, VersionAgedOrdering) == (policy == "heddle")
    runs = []
    for sample in (0, 1):
        traj = Trajectory(f"t{sample}", "g", 10, instance="w0")
        run = TrajectoryRun(traj, tasks[0], 0, sample, env.episode(tasks[0], 0, sample, traj.id))
        run.segments.append(("1", 0, 5))
        session.runs[traj.id] = run
        runs.append(run)
    session._load.update(w0=5, w1=0)  # sticky keeps w0 (within DP's rebalance margin)

    async def route(run: TrajectoryRun) -> str:
        session._live.update(("w0", "w1"))  # as once both workers serve the weights
        return await session._route(run)

    assert asyncio.run(route(runs[0])) == "w0"  # its KV is current: it stays
    session.push_weights(v2)
    runs[1].segments.append(("2", 5, 9))  # a step on the new weights since
    moved = asyncio.run(route(runs[0]))
    assert moved == ("w1" if policy == "heddle" else "w0")
    assert asyncio.run(route(runs[1])) == "w0"
    assert session.groups.age(runs[0]) == session.groups.age(runs[1]) == 1
