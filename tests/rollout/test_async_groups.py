"""Finished groups streamed to a trainer, the quota stop and the carry-over (docs/async.md).

The session runs on real ``heddle worker --engine sim`` processes over HTTP; the
trainer takes batches in process (``session.groups``) and over the trainer API.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from heddle.api import AsynchronySpec, WeightsSpec
from heddle.rollout import Batch, SyntheticEnvironment
from heddle.scheduler import TrajectoryScript
from heddle.worker import WorkerEndpoint

from .._rollout_fixtures import read_records, start_pool
from ..worker.test_weights import fake_checkpoint
from .test_session import _session, _synthetic

# Starts sim worker processes for the module: not the inner loop (README).
pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "async" / "stream_groups.py"


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[WorkerEndpoint]]]:
    """Two real sim workers for the module; checkpoints go under the returned folder."""
    tmp = tmp_path_factory.mktemp("async-groups")
    local, workers = start_pool([1, 1], tmp)
    try:
        yield tmp, workers
    finally:
        asyncio.run(local.stop())


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stream_groups", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    # Each group says its own place in completion order (taken oldest version first).
    places = [g.completed for b in batches for g in b.groups]
    assert all(p >= 0 for p in places) and len(set(places)) == len(places)


def test_quota_batches_carry_the_tail_over_within_the_bound(
    pool: tuple[Path, list[WorkerEndpoint]],
) -> None:
    tmp_path, workers = pool
    versions = [WeightsSpec(fake_checkpoint(tmp_path / f"q{n}"), str(n)) for n in range(3)]
    tasks, env = _synthetic(6, 2, tool_scale=0.3)
    out = tmp_path / "quota.jsonl"
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


def _scripted(env: SyntheticEnvironment, long_tasks: set[int], samples: int) -> None:
    """Give ``env`` one-turn tasks, and three tool gaps of 0.4 s for ``long_tasks``: those
    finish over a second after the short ones however the engines batch (the waits are real)."""
    scripts = []
    for i in range(len(env.scripts) // samples):
        turns = 4 if i in long_tasks else 1
        for s in range(samples):
            scripts.append(
                TrajectoryScript(
                    f"p{i}-{s}",
                    f"p{i}",
                    s,
                    16,
                    (4,) * (turns - 1) + (24,),
                    ("sandbox",) * (turns - 1),
                    (0.4,) * (turns - 1),
                    (8,) * (turns - 1),
                )
            )
    env.scripts = scripts


@pytest.mark.parametrize("policy", ["heddle", "verl"])
def test_heddle_takes_the_oldest_version_first_and_baselines_in_completion_order(
    pool: tuple[Path, list[WorkerEndpoint]], policy: str
) -> None:
    """A group begun on version 0 finishes after two begun on version 1; the next batch
    takes it first under ``heddle`` (heddle.scheduler.take_oldest, the simulator's take),
    and the two fresh ones, in completion order, under ``verl``."""
    tmp_path, workers = pool
    versions = [WeightsSpec(fake_checkpoint(tmp_path / f"o-{policy}{n}"), str(n)) for n in range(2)]
    tasks, env = _synthetic(5, 2, tool_scale=1.0)
    assert isinstance(env, SyntheticEnvironment)
    _scripted(env, {0}, 2)
    out = tmp_path / f"oldest-{policy}.jsonl"
    spec = AsynchronySpec(max_staleness_versions=1, groups_per_iteration=2, over_sample=0.5)
    session = _session(
        workers, out, tasks, env, 2, weights=versions[0], asynchrony=spec, policy=policy
    )
    batches: list[Batch] = []

    async def trainer() -> None:
        run = asyncio.create_task(session.run())
        # Tasks 0-2 start (the window: ceil(2 x 1.5)); 1 and 2, one turn each, are the batch.
        batches.append(await session.groups.next_batch())
        while not any(r.segments for r in session.runs.values() if r.task_index == 0):
            await asyncio.sleep(0.01)  # task 0's first step ran on version 0
        # Taking admitted tasks 3 and 4: their first steps run on version 1.
        session.push_weights(versions[1])
        while session.groups.state()["complete"] < 3:  # 0, 3 and 4 all finished
            await asyncio.sleep(0.01)
        while (batch := await session.groups.next_batch()) is not None:
            batches.append(batch)
        await run

    asyncio.run(trainer())
    taken = [[g.task_index for g in b.groups] for b in batches]
    completed = {g.task_index: g.completed for b in batches for g in b.groups}
    assert sorted(taken[0]) == [1, 2]
    # The old group finished after both new ones (else this test shows nothing).
    assert completed[0] > max(completed[3], completed[4])
    first_new, second_new = sorted((3, 4), key=completed.__getitem__)
    if policy == "heddle":
        assert taken[1:] == [[0, first_new], [second_new]]
    else:
        assert taken[1:] == [[first_new, second_new], [0]]
    staleness = {g.task_index: g.staleness for b in batches for g in b.groups}
    assert staleness[0] == 1 and staleness[3] == staleness[4] == 0
    # The output holds what the trainer took, in the order it took it.
    order = [t for batch in taken for t in batch]
    assert [r["task_id"] for r in read_records(out)] == [tasks[t].id for t in order for _ in "ab"]


def test_the_example_streams_batches_over_http_and_pushes_between_them(tmp_path: Path) -> None:
    """examples/async/stream_groups.py on a sim worker: the trainer takes three batches over
    the trainer API with heddle.client.TrainerClient and pushes two versions over HTTP."""
    module = example()
    summary = tmp_path / "summary.json"
    args = module.parse(["--out", str(tmp_path / "out"), "--summary", str(summary)])
    assert asyncio.run(module.main(args)) == 0
    got = json.loads(summary.read_text())
    assert got["wrong"] == [] and got["records"] == 12 and got["pushes"] == 2
    assert [b["weight_version"] for b in got["batches"]] == ["0", "1", "2"]
    assert max(s for b in got["batches"] for s in b["staleness"]) <= 1
    lengths = got["lengths"]
    assert lengths["trained"] == lengths["started"] == 12
    assert lengths["trained_mean_tokens"] == pytest.approx(lengths["started_mean_tokens"])


def test_without_a_quota_groups_stream_as_they_complete(
    pool: tuple[Path, list[WorkerEndpoint]],
) -> None:
    tmp_path, workers = pool
    tasks, env = _synthetic(4, 3, tool_scale=0.2)
    out = tmp_path / "stream.jsonl"
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


SYNTHETIC = Path(__file__).resolve().parents[2] / "examples" / "synthetic"


def _trainer_job(tmp_path: Path) -> Path:
    """A quota job (16 tasks x 2 samples, batches of 4) on the synthetic example's workload."""
    synthetic = SYNTHETIC
    (tmp_path / "job.yaml").write_text(
        "apiVersion: heddle.dev/v1alpha1\nkind: RolloutJob\nmetadata: {name: run-trainer}\n"
        "spec:\n  enginePool: tiny\n  samplesPerTask: 2\n"
        f"  environment: {{type: synthetic, synthetic: {{workload: {synthetic}/workload.yaml, "
        "toolTimeScale: 0.2}}\n"
        "  asynchrony: {groupsPerIteration: 4, overSample: 0.5}\n"
        "  output: {path: out.jsonl}\n"
    )
    return tmp_path / "job.yaml"


def _serve_run(tmp_path: Path) -> tuple[Any, str, str]:
    """`heddle run --trainer-port 0` on sim workers in another process: (proc, url, token)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "heddle", "run", str(_trainer_job(tmp_path)), "--pool",
           str(SYNTHETIC / "pool.yaml"), "--engine", "sim", "--time-scale", "0.05", "--quiet",
           "--trainer-port", "0"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]
    if not lines[0].startswith("trainer API: "):
        proc.kill()
        raise AssertionError([*lines, proc.communicate()[1][-2000:]])
    url, token = lines[0].split()[2], lines[1].split()[2]
    info = json.loads((tmp_path / "out.jsonl.trainer.json").read_text())
    assert info["url"] == url and info["token"] == token
    return proc, url, token


def test_heddle_run_serves_the_trainer_api(tmp_path: Path) -> None:
    """`heddle run --trainer-port 0`: a trainer in another process takes the batches, and
    the answer with the last one says the end, so the client asks no more."""
    from heddle.client import TrainerClient

    proc, url, token = _serve_run(tmp_path)
    try:

        async def take() -> tuple[list[dict], bool]:
            async with TrainerClient(url, token=token, poll_s=5.0) as client:
                got = [batch async for batch in client.batches()]
                return got, client.ended

        batches, ended = asyncio.run(take())
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    assert [len(b["groups"]) for b in batches] == [4, 4, 4, 4] and batches[-1]["last"] and ended
    records = read_records(tmp_path / "out.jsonl")
    taken = [g["task_id"] for b in batches for g in b["groups"]]
    assert [r["task_id"] for r in records] == [t for t in taken for _ in range(2)]
    assert not (tmp_path / "out.jsonl.trainer.json").exists()


def test_the_trainer_api_serves_on_until_a_trainer_heard_the_end(tmp_path: Path) -> None:
    """A trainer that released the stream and is still training when the run ends finds the
    API answering `end` (not a closed port); nothing it did not take is lost."""
    from heddle.client import TrainerClient

    proc, url, token = _serve_run(tmp_path)
    try:

        async def take() -> tuple[dict | None, dict | None]:
            async with TrainerClient(url, token=token, poll_s=5.0) as client:
                first = await client.next_batch()
                await client.release()  # the rest is written as it completes
                while not (await client.state())["closed"]:  # "training" past the run's end
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.5)
                return first, await client.next_batch()

        first, after = asyncio.run(take())
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    assert first is not None and len(first["groups"]) == 4 and after is None
    records = read_records(tmp_path / "out.jsonl")
    keys = [(r["task_id"], r["sample"]) for r in records]
    assert len(keys) == 16 * 2 == len(set(keys))
    taken = [g["task_id"] for g in first["groups"] for _ in range(2)]
    assert [r["task_id"] for r in records[:8]] == taken


def test_a_cancel_during_the_trainer_linger_stops_the_api_at_once(tmp_path: Path) -> None:
    """Ctrl-C while the run, ended, waits for a trainer to hear it: the trainer API stops
    serving at once (not up to END_LINGER_S later, detached), and the cancel goes on."""
    import time

    import httpx

    from heddle.client import TrainerClient
    from heddle.rollout import GatewayOptions, prepare_job, run_local, worker_options
    from heddle.rollout._trainer_api import END_LINGER_S

    local = prepare_job(_trainer_job(tmp_path), SYNTHETIC / "pool.yaml", None)
    where: list[tuple[str, str]] = []

    async def main() -> float:
        run = asyncio.create_task(
            run_local(
                local,
                worker_options(local, "sim", time_scale=0.05),
                trainer=GatewayOptions(),
                on_trainer=lambda url, token: where.append((url, token)),
            )
        )
        while not where:
            await asyncio.sleep(0.05)
        url, token = where[0]
        async with TrainerClient(url, token=token, poll_s=5.0) as client:
            assert await client.next_batch() is not None
            await client.release()  # the rest is written as it completes
            while not (await client.state())["closed"]:  # the run ended: the linger begins
                await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        assert not run.done()  # lingering: no trainer was told the end
        cancelled = time.monotonic()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        took = time.monotonic() - cancelled
        async with httpx.AsyncClient() as http:  # the port no longer answers
            with pytest.raises(httpx.TransportError):
                await http.get(f"{url}/v1/stream", headers={"authorization": f"Bearer {token}"})
        return took

    took = asyncio.run(main())
    assert took < 10.0 < END_LINGER_S
    assert not (tmp_path / "out.jsonl.trainer.json").exists()
    assert (tmp_path / "out.jsonl.summary.json").exists()  # the run had ended: summarised
    keys = [(r["task_id"], r["sample"]) for r in read_records(tmp_path / "out.jsonl")]
    assert len(keys) == 16 * 2 == len(set(keys))
