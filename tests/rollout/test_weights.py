"""RolloutJob spec.weights: parsed, then loaded on every worker before it takes a step.

The session runs on real ``heddle worker --engine sim`` processes over HTTP; the
sim engine records the version only (its tokens never change). The swap on
real vLLM is tested in tests/worker/test_weights_vllm.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.api import RolloutJobSpec, WeightsSpec
from heddle.exceptions import CheckpointError, ManifestError
from heddle.rollout import LocalPool, prepare_job
from heddle.worker import WorkerEndpoint

from .._rollout_fixtures import read_records
from ..api.test_manifests import JOB, _with
from ..worker.test_weights import fake_checkpoint
from .test_session import _session, _synthetic

# Starts sim worker processes for the module: not the inner loop (README).
pytestmark = pytest.mark.slow


def test_weights_are_parsed_and_an_integer_version_is_text() -> None:
    job = RolloutJobSpec.from_manifest(
        _with(JOB, "spec.weights", {"path": "/ckpt/step-3", "version": 3})
    )
    assert job.weights == WeightsSpec("/ckpt/step-3", "3")
    assert RolloutJobSpec.from_manifest(JOB).weights is None


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"version": "1"}, "spec.weights.path is required"),
        ({"path": "/c", "version": ""}, "spec.weights.version='' must be a non-empty string"),
        ({"path": "/c", "version": True}, "spec.weights.version=True must be"),
        ({"path": "/c"}, "spec.weights.version is required"),
        ({"path": "/c", "version": "1", "step": 1}, "step"),
    ],
)
def test_bad_weights_are_named(weights: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=None) as err:
        RolloutJobSpec.from_manifest(_with(JOB, "spec.weights", weights))
    assert message in str(err.value)


def test_the_crd_takes_weights_with_a_string_or_integer_version() -> None:
    import jsonschema

    from ..operator._cluster import validate

    for version in ("step-3", 3):
        validate("rolloutjobs", _with(JOB, "spec.weights", {"path": "/c", "version": version}))
    with pytest.raises(jsonschema.ValidationError):
        validate("rolloutjobs", _with(JOB, "spec.weights", {"version": 3}))


def test_heddle_run_resolves_a_relative_checkpoint_against_the_job_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    # The job's tool is at host "s": heddle run allows loopback only unless told more.
    monkeypatch.setenv("HEDDLE_TOOL_ALLOWED_HOSTS", "s")
    pool = {**JOB, "kind": "EnginePool", "metadata": {"name": "p"}}
    pool["spec"] = {"model": "sim", "gpus": 1, "tensorParallelSizes": [1]}
    job = _with(JOB, "spec.weights", {"path": "ckpt/step-1", "version": 1})
    job["spec"]["tasks"] = {"inline": [{"id": "a", "prompt": "hi"}]}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump_all([job, pool]))
    local = prepare_job(tmp_path / "job.yaml")
    assert local.job.weights == WeightsSpec(str(tmp_path / "ckpt" / "step-1"), "1")


def _versions(workers: list[WorkerEndpoint]) -> list[str | None]:
    return [
        httpx.get(f"{w.url}/v1/state", headers=_bearer(w)).json()["weight_version"] for w in workers
    ]


def _bearer(worker: WorkerEndpoint) -> dict[str, str]:
    """The local pool's token: its workers answer no one else."""
    return {"Authorization": f"Bearer {worker.token}"}


def test_every_worker_serves_the_version_before_a_step_and_records_carry_it(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    assert _versions(workers) == [None, None]
    weights = WeightsSpec(fake_checkpoint(tmp_path / "step-7"), "7")
    tasks, env = _synthetic(4, 2)
    out = tmp_path / "out.jsonl"
    versions: dict[str, str] = {}
    session = _session(workers[:1], out, tasks, env, 2, weights=weights, weight_versions=versions)

    async def go() -> None:
        run = asyncio.create_task(session.run())
        await asyncio.sleep(0.3)
        session.add_worker(workers[1])  # joins mid-run: loaded before it is used
        await run

    asyncio.run(go())
    records = read_records(out)
    assert len(records) == 8 and {r["weight_version"] for r in records} == {"7"}
    assert _versions(workers) == ["7", "7"]
    assert versions == {workers[0].name: "7", workers[1].name: "7"}


def test_a_worker_restarted_mid_run_is_brought_back_to_the_version(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    pool, workers = sim_pool
    weights = WeightsSpec(fake_checkpoint(tmp_path / "step-8"), "8")
    tasks, env = _synthetic(16, 4, tool_scale=2.0)  # runs long enough to see the worker back
    out = tmp_path / "out.jsonl"
    session = _session(workers, out, tasks, env, 4, weights=weights)

    async def version_of(worker: WorkerEndpoint) -> str | None:
        async with httpx.AsyncClient() as http:
            state = (await http.get(f"{worker.url}/v1/state", headers=_bearer(worker))).json()
            return state["weight_version"]  # type: ignore[no-any-return]

    async def go() -> None:
        run = asyncio.create_task(session.run())
        while not out.exists() or not read_records(out):
            await asyncio.sleep(0.02)
        pool.kill(workers[0].name)
        # A new process, on its start-up weights (it may be reloaded before we can look).
        await pool.restart(workers[0].name)
        for _ in range(200):  # the session reloads it before it takes steps again
            if await version_of(workers[0]) == "8" and workers[0].name in session._live:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the restarted worker was not brought back to version 8")
        assert not run.done()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(go())
    assert _versions(workers) == ["8", "8"]
    assert {r["weight_version"] for r in read_records(out)} == {"8"}


def test_a_checkpoint_that_does_not_load_stops_the_job_and_workers_keep_theirs(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    tasks, env = _synthetic(2, 2)
    out = tmp_path / "out.jsonl"
    missing = tmp_path / "step-9"
    session = _session(workers, out, tasks, env, 2, weights=WeightsSpec(str(missing), "9"))
    with pytest.raises(CheckpointError) as err:
        asyncio.run(session.run())
    message = str(err.value)
    assert f"spec.weights (path {missing}, version 9) did not load" in message
    assert f"checkpoint {missing} does not exist or is not a directory" in message
    assert _versions(workers) == [None, None]
    assert not out.exists() or read_records(out) == []


def test_a_worker_that_refuses_the_token_is_not_asked_to_load_again(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, (good, stale) = sim_pool
    stale = dataclasses.replace(stale, token="the-old-token")
    weights = WeightsSpec(fake_checkpoint(tmp_path / "step-9"), "9")
    tasks, env = _synthetic(8, 4, tool_scale=0.5)  # a few seconds: many health rounds
    out = tmp_path / "out.jsonl"
    session = _session([good, stale], out, tasks, env, 4, weights=weights)

    def refused_so_far() -> dict[str, float]:  # the worker may have served other tests
        metrics = httpx.get(f"{stale.url}/metrics", timeout=5).text
        return {
            label: float(value)
            for label, value in (line.rsplit(" ", 1) for line in metrics.splitlines())
            if label.startswith("heddle_worker_requests_total") and 'status="401"' in label
        }

    before = refused_so_far()
    asyncio.run(session.run())
    records = read_records(out)
    assert len(records) == 32 and {r["weight_version"] for r in records} == {"9"}
    refused = {k: v - before.get(k, 0.0) for k, v in refused_so_far().items()}
    # One refused load; before, its open /readyz had it asked again every health round.
    # The two DELETEs are the session's purges of its job's contexts, at its start and end.
    assert {k: v for k, v in refused.items() if v} == {
        'heddle_worker_requests_total{route="DELETE unmatched",status="401"}': 2.0,
        'heddle_worker_requests_total{route="POST unmatched",status="401"}': 1.0,
    }
