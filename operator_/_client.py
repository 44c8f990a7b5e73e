"""An async client of one worker's HTTP API (docs/worker-api.md).

Failures come back as two exceptions: :class:`WorkerUnavailableError` (no
connection, timeout, 5xx: the step can run elsewhere) and
:class:`WorkerRejectedError` (4xx: the request itself is at fault).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from heddle.exceptions import WorkerRejectedError, WorkerUnavailableError

__all__ = ["StepReply", "WorkerClient", "WorkerEndpoint"]


@dataclass(frozen=True)
class WorkerEndpoint:
    """One engine instance as the session sees it."""

    name: str
    url: str  # http://host:port
    tp: int = 1


@dataclass(frozen=True)
class StepReply:
    appended_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    logprobs: list[float] | None
    queue_s: float
    total_s: float


class WorkerClient:
    """Requests to one worker over a shared :class:`httpx.AsyncClient`."""

    def __init__(
        self, endpoint: WorkerEndpoint, http: httpx.AsyncClient, *, step_timeout_s: float = 600.0
    ) -> None:
        self.endpoint = endpoint
        self.http = http
        self.step_timeout_s = step_timeout_s

    @property
    def name(self) -> str:
        return self.endpoint.name

    async def _request(
        self, method: str, path: str, *, json: Any = None, timeout: float = 30.0
    ) -> httpx.Response:
        url = self.endpoint.url + path
        try:
            reply = await self.http.request(method, url, json=json, timeout=timeout)
        except httpx.TimeoutException:
            raise WorkerUnavailableError(
                self.name, f"{method} {path}: no answer in {timeout:g} s"
            ) from None
        except httpx.HTTPError as exc:
            raise WorkerUnavailableError(
                self.name, f"{method} {path}: {type(exc).__name__} {exc}"
            ) from None
        if reply.status_code >= 500:
            raise WorkerUnavailableError(
                self.name, f"{method} {path}: {_error(reply)}", reply.status_code
            )
        if reply.status_code >= 400:
            raise WorkerRejectedError(
                self.name, f"{method} {path}: {_error(reply)}", reply.status_code
            )
        return reply

    async def generate(
        self,
        trajectory_id: str,
        *,
        messages: Sequence[Mapping[str, str]] = (),
        append_token_ids: Sequence[int] | None = None,
        sampling: Mapping[str, Any],
        priority: int,
    ) -> StepReply:
        body: dict[str, Any] = {"sampling": dict(sampling), "priority": priority}
        if append_token_ids is not None:
            body["append_token_ids"] = list(append_token_ids)
        elif messages:
            body["messages"] = [dict(m) for m in messages]
        reply = await self._request(
            "POST",
            f"/v1/trajectories/{trajectory_id}/generate",
            json=body,
            timeout=self.step_timeout_s,
        )
        data = reply.json()
        return StepReply(
            appended_token_ids=list(data.get("appended_token_ids", [])),
            token_ids=list(data["token_ids"]),
            text=str(data["text"]),
            finish_reason=str(data["finish_reason"]),
            prompt_tokens=int(data["prompt_tokens"]),
            cached_tokens=int(data["cached_tokens"]),
            logprobs=data.get("logprobs"),
            queue_s=float(data["timings"]["queue_s"]),
            total_s=float(data["timings"]["total_s"]),
        )

    async def import_context(
        self, trajectory_id: str, token_ids: Sequence[int], *, warm: bool
    ) -> None:
        await self._request(
            "PUT",
            f"/v1/trajectories/{trajectory_id}",
            json={"token_ids": list(token_ids), "warm": warm},
            timeout=self.step_timeout_s,
        )

    async def release(self, trajectory_id: str) -> None:
        """Drop the context; a context the worker no longer holds is fine."""
        try:
            await self._request("DELETE", f"/v1/trajectories/{trajectory_id}", timeout=10.0)
        except WorkerRejectedError as exc:
            if exc.status not in (404, 409):
                raise

    async def ready(self, timeout: float = 5.0) -> bool:
        try:
            reply = await self.http.get(self.endpoint.url + "/readyz", timeout=timeout)
        except httpx.HTTPError:
            return False
        return reply.status_code == 200

    async def state(self) -> dict[str, Any]:
        reply = await self._request("GET", "/v1/state", timeout=10.0)
        data: dict[str, Any] = reply.json()
        return data


def _error(reply: httpx.Response) -> str:
    try:
        data = reply.json()
    except ValueError:
        return f"{reply.status_code} {reply.text[:300]}"
    if isinstance(data, dict) and "error" in data:
        return f"{reply.status_code} {data['error']}"
    return f"{reply.status_code} {reply.text[:300]}"
