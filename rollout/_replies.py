"""Replies of the tool and reward servers: read with a cap, and why an exchange broke.

Apart from the tools environment so that the reward scorers (which the
environments name) use them without a circle through it.
"""

from __future__ import annotations

import httpx

from heddle.exceptions import ToolError

from ._hosts import HostRefusedError

__all__ = ["MAX_REPLY_BYTES", "read_capped", "transport_cause"]

MAX_REPLY_BYTES = 1 << 20  # a tool reply's HTTP body at most; a longer one is refused unread


async def read_capped(reply: httpx.Response, who: str, cap: int) -> bytes:
    """The body, refused (unread) once it passes ``cap`` bytes; ``who`` names the sender."""
    too_large = ToolError(
        f"{who} replied with more than {cap} bytes, the cap on a reply; the rest was not read"
    )
    declared = reply.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in reply.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise too_large  # leaving the stream closes the connection mid-body
        chunks.append(chunk)
    return b"".join(chunks)


def transport_cause(exc: httpx.HTTPError, server: str = "tool server") -> str:
    """A sentence naming why the exchange broke (never the URL: it may go to the model)."""
    causes: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(causes) < 8:
        causes.append(seen)
        seen = seen.__cause__ or seen.__context__
    refused = next((c for c in causes if isinstance(c, HostRefusedError)), None)
    if refused is not None:
        return str(refused)
    if any(isinstance(c, ConnectionResetError) for c in causes):
        return f"the {server} reset the connection"
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return f"the {server} refused the connection (nothing listens at that address)"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"the {server} closed the connection before a complete reply"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to the {server} (unknown host or unreachable)"
    if isinstance(exc, httpx.ReadError | httpx.WriteError):
        return f"the connection to the {server} broke mid-call"
    return f"the call failed below HTTP ({type(exc).__name__})"
