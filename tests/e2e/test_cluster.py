"""End to end on a real cluster (``pytest --e2e``): the operator installed by the chart,
GPU nodes, the worker image able to load the pool's model.

Set ``HEDDLE_E2E_NAMESPACE`` (default ``heddle-e2e``, must exist), ``HEDDLE_E2E_MODEL``
(default ``Qwen/Qwen3-0.6B``), ``HEDDLE_E2E_OUTPUT`` (default ``/data/heddle-e2e.jsonl``)
and ``HEDDLE_E2E_CLAIM`` (a PersistentVolumeClaim of the namespace that the job's session
pod mounts at ``/data``; unset: an emptyDir). Each test cleans up what it created.
These are the scenarios of tests/operator/test_operator.py against the real API server.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from heddle.operator._kube import ENGINEPOOLS, PODS, ROLLOUTJOBS, SECRETS, KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
NS = os.environ.get("HEDDLE_E2E_NAMESPACE", "heddle-e2e")
MODEL = os.environ.get("HEDDLE_E2E_MODEL", "Qwen/Qwen3-0.6B")
OUTPUT = os.environ.get("HEDDLE_E2E_OUTPUT", "/data/heddle-e2e.jsonl")
CLAIM = os.environ.get("HEDDLE_E2E_CLAIM")
SESSION = {  # the session pod's volume, where the output goes
    "volumes": [
        {"name": "data", **({"persistentVolumeClaim": {"claimName": CLAIM}} if CLAIM
                            else {"emptyDir": {}})}
    ],
    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
}  # fmt: skip


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def kube() -> AsyncIterator[KubeClient]:
    client = KubeClient()  # the service account in a pod, else KUBECONFIG, as the operator
    try:
        yield client
    finally:
        for resource in (ROLLOUTJOBS, ENGINEPOOLS):
            for obj in await client.list(resource, NS, {"heddle.dev/e2e": "true"}):
                await client.delete(resource, NS, obj["metadata"]["name"])
        await client.aclose()


async def _wait(probe: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await probe()
        if value:
            return value
        await asyncio.sleep(5)
    raise AssertionError(f"timed out waiting for {what}")


def _meta(name: str) -> dict[str, Any]:
    return {"name": name, "namespace": NS, "labels": {"heddle.dev/e2e": "true"}}


async def test_pool_ready_and_job_succeeds(kube: KubeClient) -> None:
    pool = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "EnginePool",
        "metadata": _meta("e2e-pool"),
        "spec": {"model": MODEL, "gpus": 2, "shape": [{"tp": 1, "replicas": 2}]},
    }
    await kube.create(ENGINEPOOLS, NS, pool)

    async def ready() -> bool:
        obj = await kube.get(ENGINEPOOLS, NS, "e2e-pool")
        conds = {
            c["type"]: c["status"] for c in ((obj or {}).get("status") or {}).get("conditions", [])
        }
        return conds.get("Ready") == "True"

    await _wait(ready, 1800, "the pool Ready")
    pods = await kube.list(PODS, NS, {"heddle.dev/pool": "e2e-pool"})
    assert len(pods) == 2
    # The pool's worker token (tests/operator/test_worker_token.py): its Secret, owned by
    # the pool so the cluster's garbage collector removes it with the pool, read by every pod.
    pool_obj = await kube.get(ENGINEPOOLS, NS, "e2e-pool")
    secret = await kube.get(SECRETS, NS, "e2e-pool-worker-token")
    assert secret is not None and pool_obj is not None
    assert secret["metadata"]["ownerReferences"][0]["uid"] == pool_obj["metadata"]["uid"]
    for pod in pods:
        (env,) = [
            e for e in pod["spec"]["containers"][0]["env"] if e["name"] == "HEDDLE_WORKER_TOKEN"
        ]
        assert env["valueFrom"]["secretKeyRef"] == {"name": "e2e-pool-worker-token", "key": "token"}
    job = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": _meta("e2e-job"),
        "spec": {
            "enginePool": "e2e-pool",
            "samplesPerTask": 4,
            "environment": {"type": "synthetic", "synthetic": {"workload": "quickstart"}},
            "output": {"path": OUTPUT},
            "session": SESSION,
        },
    }
    await kube.create(ROLLOUTJOBS, NS, job)

    async def finished() -> dict[str, Any] | None:
        obj = await kube.get(ROLLOUTJOBS, NS, "e2e-job")
        phase = ((obj or {}).get("status") or {}).get("phase")
        return obj if phase in ("Succeeded", "Failed") else None

    obj = await _wait(finished, 1800, "the job to finish")
    assert obj["status"]["phase"] == "Succeeded"
    assert obj["status"]["done"] == obj["status"]["total"] == 64


async def test_invalid_job_is_rejected_by_the_api_server(kube: KubeClient) -> None:
    from heddle.operator import ApiError

    bad = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": _meta("e2e-bad"),
        "spec": {"enginePool": "x", "samplesPerTask": 0, "output": {"path": OUTPUT}},
    }
    with pytest.raises(ApiError) as err:
        await kube.create(ROLLOUTJOBS, NS, bad)
    assert err.value.status == 422
