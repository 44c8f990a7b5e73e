"""An async client of one worker's HTTP API (docs/worker-api.md).

Failures come back as two exceptions: :class:`WorkerUnavailableError` (no
connection, timeout, 5xx, 401 (this worker holds another token): the step can
run elsewhere) and
:class:`WorkerRejectedError` (4xx: the request itself is at fault).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote

from heddle.exceptions import WorkerRejectedError, WorkerUnavailableError

from . import _json
from ._http import HttpError, HttpPool, HttpTimeoutError
from ._wire import (
    GenerateBody,
    GenerateReplyBody,
    ImportBody,
    SamplingBody,
    WeightsBody,
    WeightsReplyBody,
)

__all__ = ["StepReply", "WorkerClient", "WorkerEndpoint"]


@dataclass(frozen=True)
class WorkerEndpoint:
    """One engine instance as the session sees it."""

    name: str
    url: str  # http://host:port
    tp: int = 1
    # The pool's token (docs/worker-api.md#authentication); kept out of reprs and logs.
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class StepReply:
    appended_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    logprobs: list[float | None] | None  # null where JSON cannot carry the value (-inf, NaN)
    queue_s: float
    total_s: float
    engine_s: float = 0.0  # in the engine core: queue, prefill and decode (the worker's timings)
    # With tool_parser, from the worker's (vLLM's) parser: OpenAI-format calls and the prose.
    tool_calls: list[dict[str, Any]] | None = None
    content: str | None = None
    # Speculation (None where the worker does not speculate): draft tokens proposed and
    # accepted, and the engine steps that produced this step's tokens.
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    decode_steps: int | None = None


class WorkerClient:
    """Requests to one worker over its own keep-alive connection pool."""

    def __init__(
        self, endpoint: WorkerEndpoint, http: HttpPool, *, step_timeout_s: float = 600.0
    ) -> None:
        self.endpoint = endpoint
        self.http = http
        self.step_timeout_s = step_timeout_s

    @property
    def name(self) -> str:
        return self.endpoint.name

    async def _request(
        self, method: str, path: str, *, json_body: Any = None, timeout: float = 30.0
    ) -> Any:
        body = None if json_body is None else _json.dumps(json_body)
        try:
            status, reply = await self.http.request(method, path, body, timeout=timeout)
        except HttpTimeoutError:
            raise WorkerUnavailableError(
                self.name, f"{method} {path}: no answer in {timeout:g} s"
            ) from None
        except HttpError as exc:
            raise WorkerUnavailableError(self.name, str(exc)) from None
        if status == 401:
            # Not the request's fault: this worker holds another token (its pod predates a
            # new Secret) or none we know. Another worker may take the step.
            raise WorkerUnavailableError(
                self.name,
                f"{method} {path}: {_error(status, reply)} (the session's token is not this "
                "worker's: was the pool's Secret made again? its instances are being replaced)",
                status,
            )
        if status >= 500:
            raise WorkerUnavailableError(
                self.name, f"{method} {path}: {_error(status, reply)}", status
            )
        if status >= 400:
            raise WorkerRejectedError(
                self.name, f"{method} {path}: {_error(status, reply)}", status
            )
        if not reply:
            return None
        try:
            return _json.loads(reply)
        except ValueError:
            raise WorkerUnavailableError(
                self.name, f"{method} {path}: the reply is not JSON: {reply[:200]!r}"
            ) from None

    async def generate(
        self,
        trajectory_id: str,
        *,
        messages: Sequence[Mapping[str, Any]] = (),
        append_token_ids: Sequence[int] | None = None,
        sampling: Mapping[str, Any],
        priority: int,
        reset: bool = False,
        weight_version: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_parser: str | None = None,
    ) -> StepReply:
        body: GenerateBody = {"sampling": cast(SamplingBody, dict(sampling)), "priority": priority}
        if reset:
            body["reset"] = True
        if weight_version is not None:
            body["weight_version"] = weight_version
        if append_token_ids is not None:
            body["append_token_ids"] = list(append_token_ids)
        elif messages:
            body["messages"] = [dict(m) for m in messages]
            if tools:
                body["tools"] = [dict(t) for t in tools]
        if tool_parser is not None:
            body["tool_parser"] = tool_parser
        data: GenerateReplyBody = await self._request(
            "POST",
            f"/v1/trajectories/{trajectory_id}/generate",
            json_body=body,
            timeout=self.step_timeout_s,
        )
        timings = data["timings"]
        spec = data.get("speculation")
        return StepReply(
            appended_token_ids=list(data.get("appended_token_ids", [])),
            token_ids=list(data["token_ids"]),
            text=str(data["text"]),
            finish_reason=str(data["finish_reason"]),
            prompt_tokens=int(data["prompt_tokens"]),
            cached_tokens=int(data["cached_tokens"]),
            logprobs=data.get("logprobs"),
            queue_s=float(timings["queue_s"]),
            total_s=float(timings["total_s"]),
            engine_s=float(timings["queue_s"])
            + float(timings["prefill_s"])
            + float(timings["decode_s"]),
            tool_calls=data.get("tool_calls"),
            content=data.get("content"),
            drafted_tokens=None if spec is None else int(spec["drafted_tokens"]),
            accepted_tokens=None if spec is None else int(spec["accepted_tokens"]),
            decode_steps=None if spec is None else int(spec["decode_steps"]),
        )

    async def import_context(
        self, trajectory_id: str, token_ids: Sequence[int], *, warm: bool
    ) -> None:
        await self._request(
            "PUT",
            f"/v1/trajectories/{trajectory_id}",
            json_body=ImportBody(token_ids=list(token_ids), warm=warm),
            timeout=self.step_timeout_s,
        )

    async def release(self, trajectory_id: str) -> None:
        """Drop the context; a context the worker no longer holds is fine."""
        try:
            await self._request("DELETE", f"/v1/trajectories/{trajectory_id}", timeout=10.0)
        except WorkerRejectedError as exc:
            if exc.status not in (404, 409):
                raise

    async def purge(self, job: str, *, timeout: float = 5.0) -> None:
        """Drop every context of ``job`` the worker holds (a worker without the route: fine)."""
        try:
            await self._request("DELETE", f"/v1/trajectories?job={quote(job)}", timeout=timeout)
        except WorkerRejectedError as exc:
            if exc.status not in (404, 405):
                raise

    async def seed_drafts(
        self, job: str, task_id: str, texts: Sequence[Sequence[int]], *, timeout: float = 10.0
    ) -> int:
        """POST /v1/drafts: texts the engine's suffix cache may draft from; how many it
        inserted (0 where the engine does not run suffix decoding)."""
        data: dict[str, Any] = await self._request(
            "POST",
            "/v1/drafts",
            json_body={"job": job, "task_id": task_id, "texts": [list(t) for t in texts]},
            timeout=timeout,
        )
        return int(data["seeded"])

    async def load_weights(
        self, path: str, version: str, *, timeout: float, mode: str = "drain"
    ) -> bool:
        """POST /v1/weights; True when the worker loaded, False when it already served them.

        ``mode`` ``keep`` pauses steps in flight instead of draining them (docs/worker-api.md).
        """
        body = WeightsBody(path=path, version=version)
        if mode != "drain":
            body["mode"] = mode
        data: WeightsReplyBody = await self._request(
            "POST", "/v1/weights", json_body=body, timeout=timeout
        )
        return bool(data["loaded"])

    async def ready(self, timeout: float = 5.0) -> bool:
        try:
            status, _ = await self.http.request("GET", "/readyz", timeout=timeout)
        except HttpError:
            return False
        return status == 200

    async def state(self) -> dict[str, Any]:
        data: dict[str, Any] = await self._request("GET", "/v1/state", timeout=10.0)
        return data


def _error(status: int, reply: bytes) -> str:
    text = reply.decode("utf-8", errors="replace")
    try:
        data = json.loads(reply)
    except ValueError:
        return f"{status} {text[:300]}"
    if isinstance(data, dict) and "error" in data:
        return f"{status} {data['error']}"
    return f"{status} {text[:300]}"
