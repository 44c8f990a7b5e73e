"""An operator running in-process against ``ApiServer`` with a ``Kubelet``, and helpers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import kmock

from heddle.api import DEFAULT_ALLOWED_IMAGES, PodPolicy
from heddle.operator import OperatorConfig, run_operator
from heddle.rollout import SessionConfig

from ._cluster import ApiServer, Kubelet

T = TypeVar("T")
NS = "default"
FAST = OperatorConfig(
    namespaces=(NS,),
    reconcile_interval_s=0.3,
    status_interval_s=0.5,
    drain_timeout_s=30.0,
    metrics_port=None,
    scan_cluster=False,  # the mock serves no namespace list
    session_metrics_port=0,  # many session processes on one host: no fixed port
    job_poll_s=0.3,
    session=SessionConfig(replan_interval_s=0.5, health_interval_s=0.3, unhealthy_after=2),
    # An admin who allowed a registry that cannot be reached (the image-pull test).
    pod_policy=PodPolicy(allowed_images=(*DEFAULT_ALLOWED_IMAGES, "unpullable.invalid/")),
)


def path(plural: str, name: str | None = None, sub: str | None = None) -> str:
    base = (
        "/api/v1"
        if plural in ("pods", "services", "configmaps", "events", "secrets")
        else "/apis/heddle.dev/v1alpha1"
    )
    out = f"{base}/namespaces/{NS}/{plural}"
    return out + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


@dataclass
class Cluster:
    url: str
    http: httpx.AsyncClient
    kubelet: Kubelet
    tmp: Path
    operator: asyncio.Task[None] | None = None
    stop: asyncio.Event | None = None
    api: ApiServer | None = None  # the server: what it saw (requests), its knobs (forbid_create)

    async def apply(self, obj: dict[str, Any]) -> httpx.Response:
        plural = {
            "EnginePool": "enginepools",
            "RolloutJob": "rolloutjobs",
            "ConfigMap": "configmaps",
            "Secret": "secrets",
        }[obj["kind"]]
        return await self.http.post(path(plural), json=obj)

    async def patch(self, plural: str, name: str, patch: dict[str, Any]) -> httpx.Response:
        return await self.http.patch(
            path(plural, name), json=patch, headers={"Content-Type": "application/merge-patch+json"}
        )

    async def get(self, plural: str, name: str) -> dict[str, Any] | None:
        reply = await self.http.get(path(plural, name))
        return reply.json() if reply.status_code == 200 else None

    async def list(self, plural: str) -> list[dict[str, Any]]:
        return list((await self.http.get(path(plural))).json().get("items", []))

    async def delete(self, plural: str, name: str) -> httpx.Response:
        return await self.http.delete(path(plural, name))

    async def start_operator(self) -> None:
        self.stop = asyncio.Event()
        config = OperatorConfig(**{**FAST.__dict__, "api_server": self.url, "data_root": self.tmp})
        self.operator = asyncio.create_task(run_operator(config, stop_flag=self.stop))

    async def stop_operator(self) -> None:
        if self.operator is None or self.stop is None:
            return
        self.stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.operator, 60)
        self.operator = None


async def wait_for(
    probe: Callable[[], Awaitable[T | None]], timeout: float = 60.0, what: str = "condition"
) -> T:
    """Poll ``probe`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


@contextlib.asynccontextmanager
async def cluster(tmp: Path, *, operator: bool = True) -> AsyncIterator[Cluster]:
    async with ApiServer() as api, kmock.Server(api) as server:
        url = str(server.url).rstrip("/")
        (tmp / "logs").mkdir(exist_ok=True)
        async with Kubelet(url, tmp / "logs") as kubelet, httpx.AsyncClient(base_url=url) as http:
            c = Cluster(url, http, kubelet, tmp, api=api)
            try:
                if operator:
                    await c.start_operator()
                yield c
            finally:
                await c.stop_operator()


def pool(name: str, gpus: int, shape: Any = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "tiny",
        "gpus": gpus,
        "gpusPerNode": 4,
        "tensorParallelSizes": [1, 2, 4],
    }
    if shape is not None:
        body["shape"] = shape
    body.update(spec)
    return {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "EnginePool",
        "metadata": {"name": name},
        "spec": body,
    }


def job(name: str, pool_name: str, output: Path, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "enginePool": pool_name,
        "samplesPerTask": 4,
        "environment": {
            "type": "synthetic",
            "synthetic": {"workload": "quickstart", "toolTimeScale": 0.5},
        },
        "output": {"path": str(output)},
    }
    body.update(spec)
    return {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": name},
        "spec": body,
    }
