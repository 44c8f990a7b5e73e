"""Tool calls: the Hermes parser, and HTTP calls with retries against a real tool server."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from heddle.exceptions import ConfigError, ToolError
from heddle.operator._manifests import ToolEndpointSpec
from heddle.operator._tools import HermesParser, ToolCall, call_tool, get_parser

from .conftest import ToolServer


def test_hermes_parser_finds_calls_and_reports_bad_ones() -> None:
    text = (
        'think <tool_call>{"name": "search", "arguments": {"q": "kopf"}}</tool_call> and '
        '<tool_call>{"name": "calc", "arguments": "{\\"x\\": 1}"}</tool_call>'
        '<tool_call>{oops}</tool_call><tool_call>{"arguments": {}}</tool_call>'
    )
    calls, errors = HermesParser().parse(text)
    assert calls == [ToolCall("search", {"q": "kopf"}), ToolCall("calc", {"x": 1})]
    assert len(errors) == 2
    assert "not valid JSON" in errors[0]
    assert '"name": string' in errors[1]
    assert HermesParser().parse("no calls here") == ([], [])


def test_unknown_parser_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"choose one of \['hermes'\]"):
        get_parser("mistral")


def _call(server: ToolServer, path: str, retries: int = 2, timeout: float = 2.0) -> str:
    async def go() -> str:
        async with httpx.AsyncClient() as client:
            endpoint = ToolEndpointSpec("t", server.url + path, timeout, retries)
            return await call_tool(client, endpoint, ToolCall("t", {"x": 1}), "traj-1")

    return asyncio.run(go())


def test_tool_reply_content(tool_server: ToolServer) -> None:
    assert _call(tool_server, "/ok") == 't says {"x": 1}'
    assert tool_server.calls[0][1]["trajectory_id"] == "traj-1"


def test_flaky_tool_is_retried_until_it_answers(tool_server: ToolServer) -> None:
    assert _call(tool_server, "/flaky", retries=2) == "flaky ok"
    assert len(tool_server.calls) == 3


@pytest.mark.parametrize(
    ("path", "retries", "message", "attempts"),
    [
        ("/garbage", 1, 'reply is not JSON {"content": string}', 2),
        ("/slow", 1, "no answer within 0.2 s", 2),
        ("/refuse", 3, "refused the call (400)", 1),  # the model's fault: no retry
    ],
)
def test_failing_tool_raises_after_retries(
    tool_server: ToolServer, path: str, retries: int, message: str, attempts: int
) -> None:
    with pytest.raises(ToolError) as err:
        _call(tool_server, path, retries=retries, timeout=0.2)
    assert message in str(err.value)
    assert len(tool_server.calls) == attempts
