"""Issue 24, replayed against the session side: tool egress and the job's gateway.

Each test is an attempt from the issue and asserts the refusal; real sockets and
real HTTP servers throughout.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpcore
import httpx
import pytest
from aiohttp import web

from heddle.api import ExternalSpec, ToolEndpointSpec, ToolsSpec
from heddle.rollout import (
    ExternalEnvironment,
    Gateway,
    HostAllowList,
    HostRefusedError,
    ToolInvocation,
    ToolsEnvironment,
    guarded_client,
)
from heddle.rollout._gateway import MAX_BODY_BYTES

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def tool_server() -> AsyncIterator[int]:
    """A tool on 127.0.0.1 that answers every call; yields its port."""

    async def call(request: web.Request) -> web.Response:
        return web.json_response({"content": "42"})

    app = web.Application()
    app.router.add_post("/call", call)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield port
    finally:
        await runner.cleanup()


def _tools(url: str) -> ToolsSpec:
    return ToolsSpec(endpoints=(ToolEndpointSpec("calc", url, timeout_s=5.0, retries=0),))


async def test_an_empty_allow_list_lets_a_tool_reach_nothing(tool_server: int) -> None:
    """Finding 3: an empty list meant open; a session pod gets the operator's list, empty
    by default, and its tool calls now go nowhere."""
    env = ToolsEnvironment(_tools(f"http://127.0.0.1:{tool_server}/call"), allowed=HostAllowList())
    try:
        text, failed = await env.run(ToolInvocation("calc", {}), "t")
    finally:
        await env.close()
    assert failed
    assert "tool host '127.0.0.1' resolves to ['127.0.0.1'], none of which the operator" in text
    opened = ToolsEnvironment(
        _tools(f"http://127.0.0.1:{tool_server}/call"), allowed=HostAllowList.parse("*")
    )
    try:
        assert await opened.run(ToolInvocation("calc", {}), "t") == ("42", False)  # the opt-out
    finally:
        await opened.close()


class _Recorder(httpcore.AsyncNetworkBackend):
    """Records where connections go, then connects for real."""

    def __init__(self) -> None:
        self.hosts: list[str] = []
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self.hosts.append(host)
        return await self.inner.connect_tcp(host, port, timeout, local_address, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


async def test_a_name_is_resolved_once_and_the_checked_address_is_the_one_connected(
    tool_server: int,
) -> None:
    """Finding 3: names were never resolved before the check, so a name could point
    anywhere (DNS rebinding); the connection now goes to the address that passed."""
    client = guarded_client(HostAllowList.parse("localhost"))
    recorder = _Recorder()
    client._transport._pool._network_backend._inner = recorder  # type: ignore[attr-defined]
    try:
        reply = await client.post(f"http://localhost:{tool_server}/call", json={})
    finally:
        await client.aclose()
    assert reply.json() == {"content": "42"}
    assert recorder.hosts == ["127.0.0.1"]  # an address, never the name for a second lookup


def test_a_listed_name_never_reaches_link_local_addresses() -> None:
    allowed = HostAllowList.parse("*.tools.example")
    metadata = ipaddress.ip_address("169.254.169.254")
    with pytest.raises(HostRefusedError, match=r"resolves to \['169.254.169.254'\]"):
        allowed._checked([metadata], "evil.tools.example", named=True)
    # Unless the admin names that network itself.
    assert HostAllowList.parse("169.254.0.0/16").address_allowed(metadata, named=False)
    both = [ipaddress.ip_address("169.254.1.1"), ipaddress.ip_address("10.0.0.7")]
    assert allowed._checked(both, "calc.tools.example", named=True) == "10.0.0.7"


async def test_redirects_and_environment_proxies_are_not_followed(
    tool_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # would receive every call
    client = guarded_client(HostAllowList.parse("127.0.0.0/8"))
    try:
        reply = await client.post(f"http://127.0.0.1:{tool_server}/call", json={})
    finally:
        await client.aclose()
    assert reply.status_code == 200 and not client.follow_redirects


@pytest.fixture
async def gateway() -> AsyncIterator[str]:
    env = ExternalEnvironment(ExternalSpec(), job="j", model="m", token="right-token")
    served = Gateway(env)
    url = await served.start()
    try:
        yield url
    finally:
        await served.stop()


async def test_a_non_ascii_gateway_token_is_a_401_not_a_500(gateway: str) -> None:
    """Finding 6: secrets.compare_digest on str raised on non-ASCII, a 500."""
    async with httpx.AsyncClient() as http:
        reply = await http.get(
            f"{gateway}/models", headers={"Authorization": "Bearer ümlaut".encode()}
        )
    assert reply.status_code == 401, reply.text
    assert reply.json()["error"]["code"] == "invalid_api_key"


async def test_a_chunked_gateway_body_is_cut_at_the_cap(gateway: str) -> None:
    """Finding 6: a body without Content-Length was read whole, however large."""
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        chunk = b" " * (1 << 20)
        for _ in range(MAX_BODY_BYTES // len(chunk) + 8):
            sent += len(chunk)
            yield chunk
            await asyncio.sleep(0)

    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(
            f"{gateway}/episodes", content=body(), headers={"Authorization": "Bearer right-token"}
        )
    assert reply.status_code == 413, reply.text
    assert f"the request is over {MAX_BODY_BYTES} bytes" in reply.text
