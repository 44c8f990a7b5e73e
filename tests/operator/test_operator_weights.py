"""RolloutJob spec.weights through the operator: kopf, an API server over HTTP, sim workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .._rollout_fixtures import read_records
from ..worker.test_weights import fake_checkpoint
from ._operator_fixture import cluster, job, pool, wait_for
from .test_operator import _condition, _finished

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _mounted(folder: Path) -> dict[str, Any]:
    """The pool's checkpoint volume, mounted where the test writes checkpoints: the
    workers load in place only under their volumes' mount paths (docs/security.md)."""
    return {
        "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
        "volumeMounts": [{"name": "ckpt", "mountPath": str(folder)}],
    }


async def test_the_pool_serves_the_jobs_version_and_shows_it_per_instance(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    checkpoint = fake_checkpoint(tmp_path / "step-3")
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}], **_mounted(tmp_path)))
        await c.apply(job("j", "p", out, weights={"path": checkpoint, "version": 3}))
        obj = await _finished(c, "j")
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
        assert {r["weight_version"] for r in read_records(out)} == {"3"}
        cond = _condition(obj, "WeightsLoaded")
        assert cond is not None and cond["status"] == "True", obj["status"]
        assert cond["message"] == f"version 3 from {checkpoint} on 2 instances"

        async def versions() -> list[Any] | None:
            ep = await c.get("enginepools", "p")
            found = [
                i.get("weightVersion") for i in (ep or {}).get("status", {}).get("instances", [])
            ]
            return found if found == ["3", "3"] else None

        await wait_for(versions, 30, "weightVersion 3 on both instances")


async def test_a_checkpoint_that_does_not_load_fails_the_job_naming_path_and_cause(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out.jsonl"
    missing = tmp_path / "nope"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 1, [{"tp": 1, "replicas": 1}], **_mounted(tmp_path)))
        await c.apply(job("j", "p", out, weights={"path": str(missing), "version": "v2"}))
        obj = await _finished(c, "j")
        assert obj["status"]["phase"] == "Failed"
        cond = _condition(obj, "WeightsLoaded")
        assert cond is not None and cond["status"] == "False"
        assert cond["reason"] == "CheckpointNotLoaded"
        assert f"checkpoint {missing} does not exist" in cond["message"]
        assert _condition(obj, "Failed")["reason"] == "CheckpointNotLoaded"  # type: ignore[index]
        ep = await c.get("enginepools", "p")
        assert all("weightVersion" not in i for i in ep["status"]["instances"])
