"""A cap on request body size, as plain ASGI (one huge body must not knock a worker over)."""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException

__all__ = ["MAX_BODY_BYTES", "BodyLimit", "too_large"]

MAX_BODY_BYTES = 8 * 2**20
"""Default cap. The largest legitimate body, a 64k-token context import, is about 0.5 MiB."""


def too_large(limit_bytes: int) -> str:
    return (
        f"request body is larger than this worker's limit of {limit_bytes} bytes; "
        "send less (e.g. shorter tool output), or start the worker with a larger --max-body-mib"
    )


class BodyLimit:
    """Answers 413 before reading a body whose Content-Length is over the limit, and
    stops reading one (chunked) that grows past it."""

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            body = json.dumps({"error": too_large(self.limit)}).encode()
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            await send({"type": "http.response.start", "status": 413, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # FastAPI re-raises HTTPException from body reading: the app's handler answers.
                    raise HTTPException(413, too_large(self.limit))
            return message

        await self.app(scope, counted, send)
