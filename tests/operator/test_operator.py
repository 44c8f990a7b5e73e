"""The operator through kopf against an API server over HTTP, with real worker processes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from ._operator_fixture import cluster, job, pool, wait_for
from .conftest import assert_exactly_once, read_records

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions", []):
        if c["type"] == kind:
            return c
    return None


def _no_errors(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


async def test_pool_gets_pods_with_gpus_and_labels_then_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with cluster(tmp_path) as c:
        reply = await c.apply(pool("p", 4, [{"tp": 2, "replicas": 1}, {"tp": 1, "replicas": 2}]))
        assert reply.status_code in (200, 201), reply.text

        async def ready() -> dict[str, Any] | None:
            obj = await c.get("enginepools", "p")
            cond = _condition(obj, "Ready")
            return obj if cond and cond["status"] == "True" else None

        obj = await wait_for(ready, 60, "pool Ready")
        pods = await c.list("pods")
        assert sorted(p["metadata"]["name"] for p in pods) == ["p-tp1-0", "p-tp1-1", "p-tp2-0"]
        for p in pods:
            tp = p["metadata"]["labels"]["heddle.dev/tp"]
            limits = p["spec"]["containers"][0]["resources"]["limits"]
            assert limits["nvidia.com/gpu"] == tp
            assert p["metadata"]["labels"]["heddle.dev/pool"] == "p"
            assert p["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
        assert obj["status"]["shape"]["summary"] == "1xTP2 + 2xTP1"
        assert obj["status"]["shape"]["readySummary"] == "3/3"
        assert all(i["phase"] == "Ready" and i["endpoint"] for i in obj["status"]["instances"])
        assert await c.get("services", "p") is not None
        assert max(c.kubelet.budget_log) <= 4
    _no_errors(caplog)


async def test_job_runs_to_succeeded_with_every_trajectory_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        reply = await c.apply(job("j", "p", out))
        assert reply.status_code in (200, 201), reply.text

        async def finished() -> dict[str, Any] | None:
            obj = await c.get("rolloutjobs", "j")
            phase = ((obj or {}).get("status") or {}).get("phase")
            return obj if phase in ("Succeeded", "Failed") else None

        obj = await wait_for(finished, 120, "job finished")
        status = obj["status"]
        assert status["phase"] == "Succeeded", status
        assert (status["done"], status["failed"], status["total"]) == (64, 0, 64)
        assert status["progress"] == "64/64"
        assert _condition(obj, "Complete")["status"] == "True"
        keys = {(f"p{i:05d}", s) for i in range(16) for s in range(4)}
        assert_exactly_once(read_records(out), keys)
    _no_errors(caplog)
