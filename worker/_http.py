"""A lean HTTP/1.1 client for the worker API: keep-alive connections on asyncio streams.

Why not httpx here: the session sends thousands of small requests per second
to a handful of workers, and httpx's connection pool spends about a
millisecond of CPU per request at that scale (measured with
``heddle bench control-loop``; docs/benchmarks.md). The worker API is plain
HTTP/1.1 with JSON bodies inside the cluster, so a small client suffices.
Tools, which may be anywhere and speak TLS, still go through httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from urllib.parse import urlsplit

from heddle.exceptions import HttpError, HttpTimeoutError

__all__ = ["KEEP_ALIVE_S", "HttpError", "HttpPool", "HttpTimeoutError"]

# How long a worker keeps an idle connection open (its server's keep-alive timeout). A
# trajectory's connection idles through its tool call; at uvicorn's default of 5 s most
# of them were closed by then, and the next step paid a failed send and a new connection.
KEEP_ALIVE_S = 75
# The client reuses a connection idle for less than this, a margin under the server's.
_REUSE_S = KEEP_ALIVE_S - 5.0

_MAX_HEADER_BYTES = 64 * 1024


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = False
        self.idle_since = 0.0  # time.monotonic() when it went back to the pool

    def close(self) -> None:
        self.writer.close()


class HttpPool:
    """Keep-alive connections to one ``http://host:port``, at most ``max_connections``.

    With ``token``, every request carries ``Authorization: Bearer <token>``.
    """

    def __init__(
        self, base_url: str, max_connections: int = 64, *, token: str | None = None
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"worker URL {base_url!r} must be http://host:port")
        self.host = parts.hostname
        self.port = parts.port or 80
        self._auth = f"Authorization: Bearer {token}" if token else None
        self.max_connections = max_connections
        self._idle: list[_Connection] = []
        self._open = 0
        self._freed = asyncio.Condition()
        self._waiting = 0  # requests waiting in _acquire for a connection
        self._closed = False

    async def _acquire(self, fresh: bool = False) -> _Connection:
        # The oldest idle connections first (the list is LIFO): past the server's keep-alive
        # they are closed there, so they go here instead of failing a request. Nobody can be
        # waiting for a connection while some are idle, so no one needs telling.
        stale = time.monotonic() - _REUSE_S
        while self._idle and self._idle[0].idle_since < stale:
            self._idle.pop(0).close()
            self._open -= 1
        if self._idle and not fresh:
            # The usual case, taken without the condition's lock (its acquire and release
            # cost more than the rest of a request here): one event loop thread, and
            # nothing is awaited between the check and the pop.
            conn = self._idle.pop()
            conn.reused = True
            return conn
        async with self._freed:
            while not self._idle and self._open >= self.max_connections:
                self._waiting += 1
                try:
                    await self._freed.wait()
                finally:
                    self._waiting -= 1
            if self._idle and fresh:
                # Idle connections older than the server's keep-alive are all closed by
                # now: drop one to make room for a new one instead of reusing it.
                self._idle.pop(0).close()
                self._open -= 1
            elif self._idle:
                conn = self._idle.pop()
                conn.reused = True
                return conn
            self._open += 1
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=2**24)
        except OSError as exc:
            await self._forget()
            raise HttpError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return _Connection(reader, writer)

    async def _forget(self) -> None:
        async with self._freed:
            self._open -= 1
            self._freed.notify()

    async def _give_back(self, conn: _Connection) -> None:
        if self._closed:
            conn.close()
            await self._forget()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)
        if self._waiting:  # the lock only when some request waits for a connection
            async with self._freed:
                self._freed.notify()

    async def request(
        self, method: str, path: str, body: bytes | None = None, *, timeout: float = 30.0
    ) -> tuple[int, bytes]:
        """(status, body). A reused connection the server had closed is retried once."""
        for attempt in range(2):
            conn = await self._acquire(fresh=attempt > 0)
            try:
                async with asyncio.timeout(timeout):
                    status, reply, keep = await self._exchange(conn, method, path, body)
            except TimeoutError:
                conn.close()
                await self._forget()
                raise HttpTimeoutError(f"{method} {path}: no answer within {timeout:g} s") from None
            except (OSError, asyncio.IncompleteReadError, HttpError) as exc:
                conn.close()
                await self._forget()
                if conn.reused and attempt == 0 and _nothing_received(exc):
                    continue  # the server closed the idle connection first
                raise HttpError(f"{method} {path}: {type(exc).__name__} {exc}") from exc
            except BaseException:
                conn.close()
                await self._forget()
                raise
            if keep:
                await self._give_back(conn)
            else:
                conn.close()
                await self._forget()
            return status, reply
        raise AssertionError("unreachable")

    async def _exchange(
        self, conn: _Connection, method: str, path: str, body: bytes | None
    ) -> tuple[int, bytes, bool]:
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        if self._auth is not None:
            head.append(self._auth)
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        elif method in ("POST", "PUT"):
            head.append("Content-Length: 0")
        conn.writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b""))
        await conn.writer.drain()
        # The whole head in one read: a reply costs one wait on the stream, not one per
        # header line. Past the stream's limit (16 MiB) readuntil refuses; a head past
        # _MAX_HEADER_BYTES is refused once read.
        try:
            head_bytes = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise HttpError("reply headers too large") from None
        if len(head_bytes) > _MAX_HEADER_BYTES:
            raise HttpError("reply headers too large")
        status_line, *lines = head_bytes[:-4].split(b"\r\n")
        try:
            status = int(status_line.split(b" ", 2)[1])
        except (IndexError, ValueError):
            raise HttpError(f"malformed status line {status_line[:80]!r}") from None
        headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            reply = await _read_chunked(conn.reader)
        elif "content-length" in headers:
            reply = await conn.reader.readexactly(int(headers["content-length"]))
        elif method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            reply = b""
        else:
            reply = await conn.reader.read()
            return status, reply, False
        keep = headers.get("connection", "").lower() != "close"
        return status, reply, keep

    async def aclose(self) -> None:
        self._closed = True
        async with self._freed:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for conn in idle:
            conn.close()
            with contextlib.suppress(Exception):
                await conn.writer.wait_closed()


def _nothing_received(exc: BaseException) -> bool:
    if isinstance(exc, asyncio.IncompleteReadError):
        return not exc.partial
    return isinstance(exc, ConnectionResetError | BrokenPipeError)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise HttpError(f"malformed chunk size {size_line[:40]!r}") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
