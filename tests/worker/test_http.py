"""The worker client's HTTP/1.1 client against a raw server: heads, bodies, keep-alive."""

from __future__ import annotations

import asyncio

import pytest

from heddle.worker import KEEP_ALIVE_S, HttpPool

pytestmark = pytest.mark.anyio

_REPLIES = {
    b"/length": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    b"/chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n"
    ),
    b"/empty": b"HTTP/1.1 204 No Content\r\n\r\n",
    b"/close": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx",
    b"/bad": b"NOT-HTTP\r\n\r\n",
}


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            writer.write(_REPLIES[path])
            await writer.drain()
            if path == b"/close":
                break
    except asyncio.IncompleteReadError:
        pass
    writer.close()


async def test_replies_are_read_whole_and_connections_kept() -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = HttpPool(f"http://127.0.0.1:{port}", max_connections=1)
    try:
        assert await pool.request("GET", "/length") == (200, b"{}")
        assert await pool.request("GET", "/chunked") == (200, b"abcde")
        assert await pool.request("DELETE", "/empty") == (204, b"")
        assert pool._open == 1 and len(pool._idle) == 1  # one connection, reused throughout
        assert await pool.request("GET", "/close") == (200, b"x")
        assert pool._open == 0
        # Requests beyond max_connections wait for the one connection, then reuse it.
        got = await asyncio.gather(*(pool.request("GET", "/length") for _ in range(5)))
        assert got == [(200, b"{}")] * 5 and pool._open == 1
        with pytest.raises(Exception, match="malformed status line"):
            await pool.request("GET", "/bad")
    finally:
        await pool.aclose()
        server.close()
        await server.wait_closed()


async def test_a_connection_idle_past_the_servers_keep_alive_is_not_reused() -> None:
    """One idle for longer than the worker keeps it is dropped before the request, so the
    request opens a new connection at once instead of failing on the old one first."""
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await _serve(reader, writer)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = HttpPool(f"http://127.0.0.1:{port}", max_connections=2)
    try:
        assert await pool.request("GET", "/length") == (200, b"{}")
        assert await pool.request("GET", "/length") == (200, b"{}")
        assert len(accepted) == 1  # fresh enough: reused
        (conn,) = pool._idle
        conn.idle_since -= KEEP_ALIVE_S  # as if it had idled through a long tool call
        assert await pool.request("GET", "/length") == (200, b"{}")
        assert len(accepted) == 2 and pool._open == 1 and pool._idle[0] is not conn
    finally:
        await pool.aclose()
        server.close()
        await server.wait_closed()
