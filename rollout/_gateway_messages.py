"""The gateway's messages: OpenAI chat messages as the worker takes them, and how they compare.

An agent sends the whole conversation with every call; the session appends only
what is new. :func:`normal_message` brings a message to the fields the model's
chat template sees (role, text content, tool calls, the call a tool message
answers), so two renderings of one conversation compare equal, tool-call
arguments as JSON values. Errors carry OpenAI's fields (:class:`GatewayError`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from heddle.exceptions import GatewayError

__all__ = [
    "ChatCall",
    "ChatReply",
    "GatewayError",
    "all_same",
    "first_difference",
    "normal_message",
    "openai_call",
    "stored_reply",
]


@dataclass(frozen=True)
class ChatReply:
    """One model turn as the gateway answers it."""

    message: Mapping[str, Any]  # the assistant message, OpenAI's shape
    finish_reason: str  # stop, length or tool_calls
    prompt_tokens: int
    completion_tokens: int


@dataclass(eq=False)
class ChatCall:
    """One chat request of an agent, waiting for its turn."""

    messages: list[dict[str, Any]]  # normalised (normal_message)
    tools: list[Mapping[str, Any]]
    tool_choice: str  # auto or none
    max_tokens: int | None
    reply: asyncio.Future[ChatReply]
    gone: bool = False  # the agent disconnected before the reply


_ROLES = {"system": "system", "developer": "system", "user": "user"}
_ROLES |= {"assistant": "assistant", "tool": "tool"}


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not (isinstance(part, Mapping) and part.get("type") == "text"):
                raise GatewayError(
                    400,
                    f"{where}[{i}] is not a text part; the gateway takes text content only "
                    '(a string, or parts {"type": "text", "text": ...})',
                    param=where,
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise GatewayError(400, f"{where} must be a string or a list of text parts", param=where)


def normal_message(raw: Any, where: str) -> dict[str, Any]:
    """An OpenAI chat message as the worker takes it (role, content, tool_calls, tool_call_id)."""
    if not isinstance(raw, Mapping):
        raise GatewayError(400, f"{where} must be a message object", param=where)
    role = _ROLES.get(str(raw.get("role")))
    if role is None:
        raise GatewayError(
            400,
            f"{where}.role={raw.get('role')!r}; use system, developer, user, assistant or tool",
            param=f"{where}.role",
        )
    message: dict[str, Any] = {
        "role": role,
        "content": _text(raw.get("content"), f"{where}.content"),
    }
    calls = raw.get("tool_calls")
    if role == "assistant" and calls:
        if not isinstance(calls, list):
            raise GatewayError(400, f"{where}.tool_calls must be a list", param=where)
        message["tool_calls"] = [
            openai_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)
        ]
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if not isinstance(call_id, str):
            raise GatewayError(
                400,
                f"{where}.tool_call_id must name the call this tool message answers",
                param=f"{where}.tool_call_id",
            )
        message["tool_call_id"] = call_id
    return message


def openai_call(raw: Any, where: str) -> dict[str, Any]:
    function = raw.get("function") if isinstance(raw, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        shape = '{"id", "type": "function", "function": {"name", "arguments"}}'
        raise GatewayError(400, f"{where} must be {shape}", param=where)
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": str(raw.get("id") or ""),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal as the model saw them: tool-call arguments compared as JSON values."""
    if (a["role"], a["content"], a.get("tool_call_id")) != (
        b["role"],
        b["content"],
        b.get("tool_call_id"),
    ):
        return False
    calls_a, calls_b = a.get("tool_calls", []), b.get("tool_calls", [])
    if len(calls_a) != len(calls_b):
        return False
    for x, y in zip(calls_a, calls_b, strict=True):
        if (x["id"], x["function"]["name"]) != (y["id"], y["function"]["name"]):
            return False
        if _json(x["function"]["arguments"]) != _json(y["function"]["arguments"]):
            return False
    return True


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def stored_reply(message: Mapping[str, Any]) -> dict[str, Any]:
    """An assistant reply as the history compares it (content null is empty)."""
    stored = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        stored["tool_calls"] = list(message["tool_calls"])
    return stored


def all_same(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


def first_difference(
    history: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why ``messages`` does not extend ``history``, in a sentence; None when it does."""
    for i, seen in enumerate(history):
        if i >= len(messages):
            return (
                f"the call sends {len(messages)} messages, fewer than the {len(history)} the "
                "model has seen in this episode"
            )
        if not _same(seen, messages[i]):
            return (
                f"messages[{i}] ({messages[i]['role']}) differs from what the model saw at "
                "that place in this episode"
            )
    if len(messages) == len(history):
        return "the call adds no message to what the model has seen; append the next one"
    return None
