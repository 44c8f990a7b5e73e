"""heddle.client against the test API server with the operator running (kopf, sim workers)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from heddle.client import ClusterAccess, Rollout, TrainerClient
from heddle.exceptions import ConfigError, HeddleError, RolloutFailedError

from .._rollout_fixtures import assert_exactly_once, read_records
from ._operator_fixture import cluster, job, pool

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_cluster_job_streams_groups_and_reports_its_status(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        # A relative output resolves under the operator's data root, as the operator does.
        rollout = await Rollout.submit_cluster(
            job("j", "p", Path("rollouts/j.jsonl")), access=ClusterAccess(c.url), data_root=tmp_path
        )
        assert rollout.output == tmp_path / "rollouts" / "j.jsonl"
        phases: list[str] = []
        dones: list[int] = []
        keys: list[tuple[str, int]] = []
        async for group in rollout.groups(poll_s=0.1):
            assert [r["sample"] for r in group.records] == [0, 1, 2, 3]
            keys += [(r["task_id"], r["sample"]) for r in group.records]
            progress = await rollout.progress()  # the RolloutJob's status, as kubectl shows it
            phases.append(progress.phase)
            dones.append(progress.done)
        expected = {(f"p{i:05d}", s) for i in range(16) for s in range(4)}
        assert len(keys) == len(set(keys)) and set(keys) == expected
        assert "Running" in phases and dones == sorted(dones), (phases, dones)
        status = await rollout.wait()
        assert status["phase"] == "Succeeded" and status["done"] == 64, status
        assert_exactly_once(read_records(rollout.output), expected)


async def test_a_cluster_job_that_fails_raises_its_failed_condition(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 1, [{"tp": 1, "replicas": 1}]))
        weights = {"path": str(missing), "version": 2}
        manifest = job("j", "p", tmp_path / "out.jsonl", weights=weights)
        rollout = await Rollout.submit_cluster(manifest, access=ClusterAccess(c.url))
        # The pool mounts no volume, so its workers have no weights roots: the load is
        # refused whether or not the path exists (docs/security.md), and the job fails.
        where = re.escape(str(missing))
        cause = (
            rf"^RolloutJob default/j failed: spec\.weights \(path {where}, version 2\) did not "
            rf"load: .*checkpoint {where}: this worker loads checkpoints in place only under "
            "its weights roots"
        )
        with pytest.raises(RolloutFailedError, match=cause):
            await rollout.wait()
        with pytest.raises(ConfigError, match=r"metadata\.name and spec\.output\.path"):
            await Rollout.submit_cluster({"spec": {}}, access=ClusterAccess(c.url))


async def test_trainer_client_for_job_says_why_a_job_has_no_trainer_api(tmp_path: Path) -> None:
    """TrainerClient.for_job refuses, in one sentence, a job that is missing, one that
    serves no trainer API, and one whose session does not serve it yet (no pool here)."""
    async with cluster(tmp_path) as c:
        access = ClusterAccess(c.url)
        with pytest.raises(ConfigError, match=r"^RolloutJob default/nope does not exist; "):
            await TrainerClient.for_job("nope", access=access)
        await c.apply(job("plain", "absent", tmp_path / "a.jsonl"))
        with pytest.raises(ConfigError, match=r"set spec\.asynchrony\.trainerApi: true$"):
            await TrainerClient.for_job("plain", access=access)
        asynchrony = {"groupsPerIteration": 1, "trainerApi": True}
        await c.apply(job("t", "absent", tmp_path / "t.jsonl", asynchrony=asynchrony))
        with pytest.raises(HeddleError, match=r"does not serve its trainer API yet"):
            await TrainerClient.for_job("t", access=access)
