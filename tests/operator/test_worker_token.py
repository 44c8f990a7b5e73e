"""Who may call a worker: the pool's token, from its Secret to the pods and the session."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.exceptions import WorkerUnavailableError
from heddle.worker import HttpPool, WorkerClient, WorkerEndpoint

from .._rollout_fixtures import assert_exactly_once, read_records, start_pool
from ._cluster import ADMIN_HEADER
from ._operator_fixture import Cluster, cluster, job, pool, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # slow: real processes, see pyproject

KEYS = {(f"p{i:05d}", s) for i in range(16) for s in range(4)}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions", []):
        if c["type"] == kind:
            return dict(c)
    return {}


async def _ready(c: Cluster, name: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        obj = await c.get("enginepools", name)
        return obj if _condition(obj, "Ready").get("status") == "True" else None

    return await wait_for(probe, 90, f"pool {name} Ready")


async def test_the_pool_gets_a_secret_its_workers_demand_and_the_job_sends_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        obj = await _ready(c, "p")
        secret = await c.get("secrets", "p-worker-token")
        assert secret is not None
        owner = secret["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"]) == ("EnginePool", obj["metadata"]["uid"])
        token = base64.b64decode(secret["data"]["token"]).decode()
        assert len(base64.urlsafe_b64decode(token + "=")) == 32  # 32 random bytes

        for pod in await c.list("pods"):
            env = pod["spec"]["containers"][0]["env"]
            assert {"name": "HEDDLE_WORKER_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": "p-worker-token", "key": "token"}}} in env  # fmt: skip
        async with httpx.AsyncClient(timeout=5) as http:
            for instance in obj["status"]["instances"]:
                url = f"{instance['endpoint']}/v1/state"
                assert (await http.get(url)).status_code == 401
                wrong = {"Authorization": "Bearer not-the-token"}
                assert (await http.get(url, headers=wrong)).status_code == 401
                right = {"Authorization": f"Bearer {token}"}
                assert (await http.get(url, headers=right)).status_code == 200
                assert (await http.get(f"{instance['endpoint']}/readyz")).status_code == 200

        await c.apply(job("j", "p", out))

        async def finished() -> dict[str, Any] | None:
            got = await c.get("rolloutjobs", "j")
            return (
                got
                if (got or {}).get("status", {}).get("phase") in ("Succeeded", "Failed")
                else None
            )

        done = await wait_for(finished, 180, "job j finished")
        assert done["status"]["phase"] == "Succeeded", done["status"]
        assert (done["status"]["done"], done["status"]["failed"]) == (64, 0)
        assert_exactly_once(read_records(out), KEYS)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


async def test_a_pod_whose_secret_is_missing_is_reported_until_an_admin_provides_it(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, operator=False) as c:
        assert c.api is not None
        c.api.forbid_create.add("secrets")  # as if the operator's RBAC lacked it
        await c.start_operator()
        await c.apply(pool("p", 1, [{"tp": 1, "replicas": 1}]))

        async def degraded() -> dict[str, Any] | None:
            cond = _condition(await c.get("enginepools", "p"), "Degraded")
            return cond if cond and cond.get("reason") == "WorkerTokenMissing" else None

        cond = await wait_for(degraded, 60, "Degraded naming the missing Secret")
        assert "cannot create Secret p-worker-token" in cond["message"]
        assert "forbidden" in cond["message"]
        # No instance without the pool's own token: a pod would start with whatever Secret
        # someone else later put under that name (docs/security.md).
        await asyncio.sleep(1.0)
        assert await c.get("pods", "p-tp1-0") is None

        # An admin provisions the token (e.g. from a secret store), owned by the pool (a
        # controller reference to its uid): the pool uses it.
        uid = (await c.get("enginepools", "p"))["metadata"]["uid"]
        owner = {"apiVersion": "heddle.dev/v1alpha1", "kind": "EnginePool", "name": "p",
                 "uid": uid, "controller": True}  # fmt: skip
        secret = {
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "p-worker-token", "ownerReferences": [owner]},
            "data": {"token": base64.b64encode(b"admin-made-token").decode()},
        }  # fmt: skip
        reply = await c.http.post(
            "/api/v1/namespaces/default/secrets", json=secret, headers={ADMIN_HEADER: "1"}
        )
        assert reply.status_code in (200, 201), reply.text
        obj = await _ready(c, "p")
        assert _condition(obj, "Degraded")["status"] == "False"
        endpoint = obj["status"]["instances"][0]["endpoint"]
        bearer = {"Authorization": "Bearer admin-made-token"}
        assert httpx.get(f"{endpoint}/v1/state", headers=bearer, timeout=5).status_code == 200


async def _state(endpoint: WorkerEndpoint) -> dict[str, Any]:
    http = HttpPool(endpoint.url, 2, token=endpoint.token)
    try:
        return await WorkerClient(endpoint, http).state()
    finally:
        await http.aclose()


def test_heddle_run_gives_its_workers_a_token_of_its_own(tmp_path: Path) -> None:
    pool_a, workers_a = start_pool([1], tmp_path / "a")
    pool_b, workers_b = start_pool([1], tmp_path / "b")
    try:
        (a,), (b,) = workers_a, workers_b
        assert a.token and b.token and a.token != b.token  # one per run
        assert a.token not in repr(a)  # never in logs
        assert all(a.token not in arg for arg in pool_a.procs[a.name].command)  # not in ps
        assert httpx.get(f"{a.url}/v1/state", timeout=5).status_code == 401
        other = {"Authorization": f"Bearer {b.token}"}
        assert httpx.get(f"{a.url}/v1/state", headers=other, timeout=5).status_code == 401
        own = {"Authorization": f"Bearer {a.token}"}
        assert httpx.get(f"{a.url}/v1/state", headers=own, timeout=5).status_code == 200
        # The session's client: its own token serves; another's is the worker's refusal,
        # not the request's fault, so the step may go to another worker.
        assert asyncio.run(_state(a)).get("engine") == "sim"
        with pytest.raises(WorkerUnavailableError) as refused:
            asyncio.run(_state(dataclasses.replace(a, token=b.token)))
        assert refused.value.status == 401
        assert "the session's token is not this worker's" in str(refused.value)
    finally:
        asyncio.run(pool_a.stop())
        asyncio.run(pool_b.stop())
