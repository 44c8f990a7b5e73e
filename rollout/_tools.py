"""The ``tools`` environment: tool calls parsed from the model's text, run over HTTP.

The worker parses each turn with the vLLM tool parser the job names (it holds
the tokenizer) and the session runs the calls it returns; the regex
:class:`HermesParser` here is the fallback for engines without one (the sim
engine). The record's messages carry the calls in OpenAI's format.

Tool protocol (docs/rollouts.md): ``POST <url>`` with JSON
``{"name": ..., "arguments": {...}, "trajectory_id": ...}``; the tool answers
200 with ``{"content": "<text for the model>"}``. Each attempt has one
deadline, ``timeoutSeconds`` from connect to the last byte, and its reply is
streamed and refused past :data:`MAX_REPLY_BYTES` without reading the rest.
Timeouts, broken connections, 5xx and replies of any other form are retried
with backoff (the exchange and its rules are ``_replies.post_json``, shared with
the reward endpoint); a 4xx (bad arguments), a redirect (not followed) or an
oversized reply is not. A call that fails in the end (or names an unknown
tool) goes back to the model as a tool message under ``onError: message``;
under ``onError: fail`` it ends the trajectory as failed with the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from heddle.api import ToolEndpointSpec, ToolsSpec
from heddle.exceptions import ToolError

from ._environments import Environment, Episode, Outcome, ParsedCalls
from ._hosts import LOCAL_DEFAULT, HostAllowList, guarded_client
from ._replies import MAX_REPLY_BYTES, RetryableError, post_json, retry_delay_s
from ._tasks import Task

__all__ = [
    "HermesParser",
    "ToolCallParser",
    "ToolInvocation",
    "ToolsEnvironment",
]


@dataclass(frozen=True)
class ToolInvocation:
    """One tool call the model made, parsed from its reply; the OpenAI wire form of a
    call is another type, :class:`heddle.worker.ToolCall`."""

    name: str
    arguments: Mapping[str, Any]
    id: str = ""

    def openai(self) -> dict[str, Any]:
        """The call as an assistant message lists it (arguments as a JSON string)."""
        arguments = json.dumps(dict(self.arguments), ensure_ascii=False)
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
        }


class ToolCallParser(ABC):
    """Finds tool calls in a turn's text; malformed ones come back as error strings."""

    name: ClassVar[str]

    @abstractmethod
    def parse(self, text: str) -> tuple[list[ToolInvocation], list[str]]:
        """(calls, errors)."""

    @abstractmethod
    def content(self, text: str) -> str:
        """The turn's text without its tool calls."""


class HermesParser(ToolCallParser):
    """Hermes/Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks."""

    name = "hermes"
    _BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> tuple[list[ToolInvocation], list[str]]:
        calls: list[ToolInvocation] = []
        errors: list[str] = []
        for block in self._BLOCK.findall(text):
            try:
                data = json.loads(block)
            except json.JSONDecodeError as exc:
                errors.append(f"tool call is not valid JSON ({exc.msg}): {block.strip()[:200]}")
                continue
            args = data.get("arguments", {}) if isinstance(data, dict) else None
            if isinstance(args, str):  # some models emit arguments as a JSON string
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = None
            if not isinstance(data, dict) or not isinstance(data.get("name"), str):
                errors.append(
                    f'tool call needs {{"name": string, "arguments": object}}: {block[:200]}'
                )
            elif not isinstance(args, dict):
                errors.append(f"tool call {data['name']!r}: arguments must be a JSON object")
            else:
                calls.append(ToolInvocation(data["name"], args))
        return calls, errors

    def content(self, text: str) -> str:
        return text.split("<tool_call>", 1)[0]


def _from_worker(parsed: ParsedCalls) -> tuple[list[ToolInvocation], list[str]]:
    """The worker's OpenAI-format calls; arguments that are not a JSON object are errors."""
    calls: list[ToolInvocation] = []
    errors: list[str] = []
    for call in parsed.calls:
        name = str(call["function"]["name"])
        try:
            args = json.loads(call["function"]["arguments"])
        except (TypeError, ValueError):
            args = None
        if isinstance(args, dict):
            calls.append(ToolInvocation(name, args, str(call.get("id", ""))))
        else:
            errors.append(f"tool call {name!r}: arguments must be a JSON object")
    return calls, errors


async def call_tool(
    client: httpx.AsyncClient,
    endpoint: ToolEndpointSpec,
    call: ToolInvocation,
    trajectory_id: str,
    *,
    max_reply_bytes: int = MAX_REPLY_BYTES,
) -> str:
    """The tool's reply content; raises :class:`ToolError` once retries are spent."""
    body = {"name": call.name, "arguments": dict(call.arguments), "trajectory_id": trajectory_id}
    last = ""
    for attempt in range(endpoint.retries + 1):
        if attempt:
            await asyncio.sleep(retry_delay_s(attempt))
        try:
            return await _attempt(client, endpoint, body, max_reply_bytes)
        except RetryableError as exc:
            last = str(exc)
    raise ToolError(f"tool {call.name!r} failed after {endpoint.retries + 1} attempts: {last}")


async def _attempt(
    client: httpx.AsyncClient, endpoint: ToolEndpointSpec, body: dict[str, Any], cap: int
) -> str:
    name = body["name"]
    raw, text = await post_json(
        client,
        endpoint.url,
        body,
        timeout_s=endpoint.timeout_s,
        cap=cap,
        who=f"tool {name!r}",
        server="tool server",
        url_field="the endpoint's url",
        refused="the call",
    )
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("content"), str):
        raise RetryableError(f'reply is not JSON {{"content": string}}: {text[:200]!r}')
    return str(data["content"])


@dataclass
class _ToolsEpisode(Episode):
    env: ToolsEnvironment | None = None

    def chat_tools(self) -> tuple[Sequence[Mapping[str, Any]], str | None]:
        env = self.env
        assert env is not None
        tools = env.spec.schemas if self.task.tools is None else self.task.tools
        return tools, env.spec.parser

    async def after_turn(
        self, turn: int, text: str, finish_reason: str, parsed: ParsedCalls | None = None
    ) -> Outcome:
        env = self.env
        assert env is not None
        if parsed is not None:
            calls, errors = _from_worker(parsed)
            content = parsed.content
        else:  # an engine without vLLM's parsers: the Hermes regex
            calls, errors = env.parser.parse(text)
            content = env.parser.content(text)
        calls = [
            c if c.id else dataclasses.replace(c, id=f"call_{turn}_{i}")
            for i, c in enumerate(calls)
        ]
        assistant = (
            {"role": "assistant", "content": content, "tool_calls": [c.openai() for c in calls]}
            if calls
            else None
        )
        if not calls and not errors:
            return Outcome(done=True, finish_reason="stop" if finish_reason == "stop" else "length")
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = await asyncio.gather(*(env.run(call, self.trajectory_id) for call in calls))
        self.tool_seconds += loop.time() - started
        messages: list[Mapping[str, Any]] = [
            {"role": "tool", "content": f"error: {e}"} for e in errors
        ]
        failures = len(errors)
        for call, (reply, failed) in zip(calls, results, strict=True):
            failures += failed
            if failed and env.spec.on_error == "fail":
                return Outcome(
                    done=True,
                    finish_reason="failed",
                    error=reply,
                    tool_calls=tuple(c.name for c in calls),
                    tool_errors=failures,
                    assistant=assistant,
                )
            messages.append({"role": "tool", "content": reply, "tool_call_id": call.id})
        return Outcome(
            messages=tuple(messages),
            tool_calls=tuple(c.name for c in calls),
            tool_errors=failures,
            assistant=assistant,
        )


class ToolsEnvironment(Environment):
    """Real tools over HTTP, one shared connection pool."""

    name = "tools"

    def __init__(
        self,
        spec: ToolsSpec,
        *,
        allowed: HostAllowList | None = None,  # None: loopback only (LOCAL_DEFAULT)
        expected_tool_s: float = 1.0,
    ) -> None:
        self.spec = spec
        self.parser = HermesParser()  # used only when the worker does not parse (sim)
        self.endpoints = {e.name: e for e in spec.endpoints}
        self.expected_tool_s = expected_tool_s
        # Each connection is checked against the list (docs/security.md, "Egress").
        self._client = guarded_client(allowed or HostAllowList.parse(LOCAL_DEFAULT))

    def episode(self, task: Task, task_index: int, sample: int, trajectory_id: str) -> Episode:
        return _ToolsEpisode(
            task, sample, trajectory_id, expected_tool_s=self.expected_tool_s, env=self
        )

    async def run(self, call: ToolInvocation, trajectory_id: str) -> tuple[str, bool]:
        """(content for the model, failed?)."""
        endpoint = self.endpoints.get(call.name)
        if endpoint is None:
            return f"error: unknown tool {call.name!r}; available: {sorted(self.endpoints)}", True
        try:
            content = await call_tool(self._client, endpoint, call, trajectory_id)
        except ToolError as exc:
            return f"error: {exc}", True
        if len(content) > self.spec.max_reply_chars:
            cut = self.spec.max_reply_chars
            content = content[:cut] + f"\n[tool reply cut at {cut} characters]"
        return content, False

    async def close(self) -> None:
        await self._client.aclose()
