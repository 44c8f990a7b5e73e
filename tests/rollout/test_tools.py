"""Tool calls: the Hermes parser, and HTTP calls with retries against a real tool server."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from heddle.api import RolloutJobSpec, ToolEndpointSpec
from heddle.exceptions import ConfigError, ManifestError, ToolError
from heddle.rollout import HostAllowList, check_tool_hosts
from heddle.rollout._tools import (
    MAX_REPLY_BYTES,
    HermesParser,
    ToolInvocation,
    call_tool,
)

from .._rollout_fixtures import ToolServer


def test_hermes_parser_finds_calls_and_reports_bad_ones() -> None:
    text = (
        'think <tool_call>{"name": "search", "arguments": {"q": "kopf"}}</tool_call> and '
        '<tool_call>{"name": "calc", "arguments": "{\\"x\\": 1}"}</tool_call>'
        '<tool_call>{oops}</tool_call><tool_call>{"arguments": {}}</tool_call>'
    )
    calls, errors = HermesParser().parse(text)
    assert calls == [ToolInvocation("search", {"q": "kopf"}), ToolInvocation("calc", {"x": 1})]
    assert len(errors) == 2
    assert "not valid JSON" in errors[0]
    assert '"name": string' in errors[1]
    assert HermesParser().parse("no calls here") == ([], [])


def _call(server: ToolServer, path: str, retries: int = 2, timeout: float = 2.0) -> str:
    async def go() -> str:
        async with httpx.AsyncClient() as client:
            endpoint = ToolEndpointSpec("t", server.url + path, timeout, retries)
            return await call_tool(client, endpoint, ToolInvocation("t", {"x": 1}), "traj-1")

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
        ("/slow", 1, "no complete answer within 0.2 s", 2),
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


def test_timeout_bounds_the_whole_call_not_each_read(tool_server: ToolServer) -> None:
    # /trickle sends a valid reply a byte every 0.5 s: each read is quick, the call is not.
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"no complete answer within 1 s"):
        _call(tool_server, "/trickle", retries=0, timeout=1.0)
    assert time.monotonic() - started < 3.0


@pytest.mark.parametrize("path", ["/huge", "/huge-unsized"])
def test_oversized_reply_is_refused_without_reading_it_all(
    tool_server: ToolServer, path: str
) -> None:
    with pytest.raises(ToolError) as err:
        _call(tool_server, path, retries=2, timeout=30.0)
    assert f"more than {MAX_REPLY_BYTES} bytes" in str(err.value)
    assert len(tool_server.calls) == 1  # the same call would answer the same: no retry
    time.sleep(0.2)  # let the server notice the hang-up
    assert tool_server.sent.get(path, 0) < 10 * 1024 * 1024  # of 20 MB


def test_redirect_is_not_followed_and_says_so(tool_server: ToolServer) -> None:
    with pytest.raises(ToolError, match=r"redirect \(302\), which is not followed"):
        _call(tool_server, "/redirect", retries=2)
    assert [path for path, _ in tool_server.calls] == ["/redirect"]


def test_connection_reset_is_named_and_retried(tool_server: ToolServer) -> None:
    with pytest.raises(ToolError) as err:
        _call(tool_server, "/reset", retries=1)
    assert "failed after 2 attempts: the tool server reset the connection" in str(err.value)
    assert len(tool_server.calls) == 2


def _tools_job(*urls: str) -> RolloutJobSpec:
    endpoints = [{"name": f"t{i}", "url": url} for i, url in enumerate(urls)]
    return RolloutJobSpec.from_manifest(
        {
            "metadata": {"name": "j"},
            "spec": {
                "enginePool": "p",
                "tasks": {"inline": [{"prompt": "x"}]},
                "environment": {"tools": {"endpoints": endpoints}},
                "output": {"path": "out.jsonl"},
            },
        }
    )


def test_tool_hosts_allow_list_matches_names_suffixes_and_networks() -> None:
    allowed = HostAllowList.parse("sandbox.rl.svc, *.tools.svc 10.20.0.0/16,::1")
    assert allowed is not None
    for host in ("sandbox.rl.svc", "SANDBOX.rl.svc.", "calc.tools.svc", "10.20.3.4", "::1"):
        assert allowed.allows(host), host
    for host in ("evil.svc", "tools.svc", "10.21.0.1", "169.254.169.254", "2130706433", "127.1"):
        assert not allowed.allows(host), host
    assert HostAllowList.parse(" , ").empty  # empty: no host at all (deny by default)
    assert not HostAllowList.parse(" , ").allows("127.0.0.1")
    assert HostAllowList.parse("*").allows("169.254.169.254")  # the admin's opt-out
    with pytest.raises(ConfigError, match=r"entry 'http://x' is neither a host name nor an IP"):
        HostAllowList.parse("http://x")


def test_tool_url_outside_the_allow_list_is_refused_with_a_sentence() -> None:
    allowed = HostAllowList.parse("127.0.0.0/8,calc.tools.svc")
    check_tool_hosts(_tools_job("http://127.0.0.1:9/a", "https://calc.tools.svc/b"), allowed)
    check_tool_hosts(_tools_job("http://169.254.169.254/latest"), HostAllowList.parse("*"))
    with pytest.raises(ManifestError) as err:
        check_tool_hosts(_tools_job("http://127.0.0.1/a", "http://169.254.169.254/x"), allowed)
    assert str(err.value) == (
        "RolloutJob 'j' spec.environment.tools.endpoints[1].url http://169.254.169.254/x: host "
        "'169.254.169.254' is not among the hosts this operator lets tools reach "
        "(HEDDLE_TOOL_ALLOWED_HOSTS; with the Helm chart, operator.toolAllowedHosts); use an "
        "allowed tool host or ask the admin to add it"
    )
