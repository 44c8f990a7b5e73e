"""Exchanges with the tool and reward servers: one POST read with a cap, which answers
are worth a retry (and how long to wait), and why an exchange broke.

Apart from the tools environment so that the reward scorers (which the
environments name) use them without a circle through it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from heddle.exceptions import ToolError

from ._hosts import HostRefusedError

__all__ = [
    "MAX_REPLY_BYTES",
    "RetryableError",
    "post_json",
    "read_capped",
    "retry_delay_s",
    "transport_cause",
]

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


class RetryableError(Exception):
    """An exchange worth trying again: no complete answer in time, a broken connection,
    a status of 5xx or below 200, or a reply that is not the JSON asked for."""


def retry_delay_s(attempt: int) -> float:
    """The wait before retry ``attempt`` (1, 2, ...): 0.2 s doubling, at most 5 s."""
    return min(5.0, 0.2 * 2.0 ** (attempt - 1))


async def post_json(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    timeout_s: float,
    cap: int,
    who: str,
    server: str,
    url_field: str,
    refused: str,
) -> tuple[bytes, str]:
    """POST ``body`` and read the 2xx reply (its bytes and their text), the whole exchange
    within ``timeout_s``.

    What a retry cannot fix is a :class:`ToolError`: a redirect (not followed: ``who``
    answered one; set ``url_field``), a 4xx (``who`` refused ``refused``), a reply past
    ``cap`` bytes. What it may is a :class:`RetryableError`: no complete answer in time,
    a broken connection (:func:`transport_cause`, naming the ``server``), a 5xx.
    """
    try:
        # httpx's timeout bounds each read; the whole exchange needs a deadline of its own.
        async with asyncio.timeout(timeout_s):
            async with client.stream(
                "POST",
                url,
                json=body,
                timeout=timeout_s,
                headers={"Accept-Encoding": "identity"},  # the cap counts what is held
            ) as reply:
                status = reply.status_code
                if 300 <= status < 400:
                    raise ToolError(
                        f"{who} answered with a redirect ({status}), which is not "
                        f"followed; set {url_field} to the address that answers"
                    )
                raw = await read_capped(reply, who, cap)
    except (TimeoutError, httpx.TimeoutException):
        raise RetryableError(
            f"no complete answer within {timeout_s:g} s (timeoutSeconds)"
        ) from None
    except httpx.HTTPError as exc:
        raise RetryableError(transport_cause(exc, server)) from None
    text = raw.decode("utf-8", errors="replace")
    if 400 <= status < 500:
        raise ToolError(f"{who} refused {refused} ({status}): {text[:300]}")
    if status >= 500 or status < 200:
        raise RetryableError(f"status {status}: {text[:200]}")
    return raw, text
