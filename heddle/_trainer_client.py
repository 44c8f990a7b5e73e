"""The trainer's side of a running session's trainer API (docs/async.md, "Streaming groups").

    async with TrainerClient(url, token=token) as client:
        async for batch in client.batches():        # groupsPerIteration groups, as they complete
            train_on(batch)
            await client.push_weights(next_checkpoint, version)

Each call is a long poll that the client repeats until something comes or the
stream ends, so a trainer waits as long as its rollout needs. On a cluster,
``await TrainerClient.for_job(name, namespace)`` finds a RolloutJob's trainer API
(``spec.asynchrony.trainerApi``) and reads its token from the job's Secret.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import httpx

from heddle.exceptions import ConfigError, HeddleError

from ._runs import ClusterAccess

__all__ = ["TrainerClient"]


class TrainerClient:
    """Finished groups, batches and weight pushes over a session's trainer API."""

    def __init__(self, url: str, *, token: str, poll_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.poll_s = poll_s
        self.ended = False  # an answer said nothing more comes
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(poll_s + 30.0, connect=10.0),
        )

    @classmethod
    async def for_job(
        cls,
        name: str,
        namespace: str = "default",
        *,
        access: ClusterAccess | None = None,
        url: str | None = None,
        poll_s: float = 30.0,
    ) -> TrainerClient:
        """The trainer API of RolloutJob ``namespace/name`` on a cluster, once its session
        serves it (``status.trainer``), with the token from the job's Secret.

        ``access``: the API server and credentials (None: the pod's service account, else
        the kubeconfig, as kubectl). The Secret's name and the URL follow from the job's
        name, as the operator makes them, never from the status (which the session pod
        writes): a session cannot point the trainer at another Secret or host. ``url``
        replaces the Service's address (a port-forward from outside the cluster, say).
        """
        from heddle.operator import (  # noqa: PLC0415  (loads kopf)
            ROLLOUTJOBS,
            SECRETS,
            TOKEN_KEY,
            KubeClient,
            trainer_secret_name,
            trainer_url,
        )

        kube = await asyncio.to_thread(KubeClient, access)
        try:
            job = await kube.get(ROLLOUTJOBS, namespace, name)
            secret_name = trainer_secret_name(name)
            secret = await kube.get(SECRETS, namespace, secret_name)
        finally:
            await kube.aclose()
        where = f"RolloutJob {namespace}/{name}"
        if job is None:
            raise ConfigError(f"{where} does not exist; check the name and the namespace")
        if not ((job.get("spec") or {}).get("asynchrony") or {}).get("trainerApi"):
            raise ConfigError(
                f"{where} serves no trainer API: set spec.asynchrony.trainerApi: true"
            )
        if not (job.get("status") or {}).get("trainer"):
            raise HeddleError(f"{where} does not serve its trainer API yet (no status.trainer); "
                              "ask again once its session runs")  # fmt: skip
        try:
            token = base64.b64decode(((secret or {}).get("data") or {})[TOKEN_KEY]).decode()
        except (KeyError, binascii.Error, UnicodeDecodeError):
            raise HeddleError(
                f"the Secret {namespace}/{secret_name} has no readable {TOKEN_KEY!r}; "
                "the operator makes it with the job"
            ) from None
        return cls(url or trainer_url(name, namespace), token=token, poll_s=poll_s)

    async def __aenter__(self) -> TrainerClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            reply = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise HeddleError(f"the trainer API at {self.url} did not answer ({exc!r})") from None
        if reply.status_code == 400:
            raise ConfigError(reply.json()["error"]["message"])
        if reply.status_code != 200:
            raise HeddleError(f"the trainer API at {self.url} answered {reply.status_code}: "
                              f"{reply.text[:200]}")  # fmt: skip
        body: dict[str, Any] = reply.json()
        return body

    async def next_group(self) -> dict[str, Any] | None:
        """The next complete group (task_id, records by sample, completed, staleness); None
        once the stream has ended."""
        return await self._next("/v1/groups/next", "group")

    async def next_batch(self) -> dict[str, Any] | None:
        """The next iteration's groups (iteration, weight_version, groups, last); None: ended."""
        return await self._next("/v1/batches/next", "batch")

    async def _next(self, path: str, key: str) -> dict[str, Any] | None:
        # Once an answer said the end, ask no more: the session may have stopped serving.
        while not self.ended:
            body = await self._call("GET", path, params={"timeout_s": self.poll_s})
            self.ended = bool(body["end"])
            if body[key] is not None:
                item: dict[str, Any] = body[key]
                return item
        return None

    async def groups(self) -> AsyncIterator[dict[str, Any]]:
        while (group := await self.next_group()) is not None:
            yield group

    async def batches(self) -> AsyncIterator[dict[str, Any]]:
        while (batch := await self.next_batch()) is not None:
            yield batch

    async def push_weights(self, path: str, version: str | int) -> dict[str, Any]:
        """New weights under the running rollout; every step from now on names ``version``."""
        return await self._call("POST", "/v1/weights", json={"path": path, "version": version})

    async def release(self) -> dict[str, Any]:
        """Take no more: the session writes the rest as it completes, and can end."""
        return await self._call("POST", "/v1/release")

    async def state(self) -> dict[str, Any]:
        return await self._call("GET", "/v1/stream")
