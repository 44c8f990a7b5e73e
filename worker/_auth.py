"""Who may call a worker: a bearer token shared by the pool's session and the worker.

With a token set, every request but the probes and ``/metrics`` must carry
``Authorization: Bearer <token>``; anything else gets 401 before the app reads
a byte of the body. The probes stay open because the kubelet cannot send a
token, and Prometheus scrapes ``/metrics`` the same way (the chart's
NetworkPolicy limits who reaches the port at all).
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from heddle.exceptions import ConfigError

__all__ = ["OPEN_PATHS", "TOKEN_ENV", "BearerToken", "document_auth", "read_token"]

TOKEN_ENV = "HEDDLE_WORKER_TOKEN"
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_SCHEME = "poolToken"

MISSING = (
    "this worker needs its pool's token: send 'Authorization: Bearer <token>' "
    "(key 'token' of the Secret <pool>-worker-token, docs/worker-api.md#authentication)"
)
WRONG = (
    "the bearer token is not this worker's; send the token of the worker's own pool "
    "(key 'token' of the Secret <pool>-worker-token)"
)


def _checked(token: str, source: str) -> str:
    token = token.strip()
    if not token:
        raise ConfigError(f"{source} is empty; put the pool's token there or leave it out")
    if not token.isascii() or not token.isprintable() or " " in token:
        raise ConfigError(
            f"{source} holds characters an HTTP header cannot carry; use printable ASCII "
            "without spaces, e.g. what secrets.token_urlsafe(32) makes"
        )
    return token


def read_token(token_file: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The worker's token: ``--token-file`` wins over ``HEDDLE_WORKER_TOKEN``; None: no token.

    The flag wins because it is the more deliberate of the two: an inherited
    environment variable must not override a file named on the command line.
    """
    if token_file is not None:
        try:
            text = Path(token_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(
                f"--token-file {token_file} cannot be read ({reason}); give a readable file"
            ) from None
        return _checked(text, f"--token-file {token_file}")
    if TOKEN_ENV in environ:
        return _checked(environ[TOKEN_ENV], TOKEN_ENV)
    return None


class BearerToken:
    """Plain ASGI: 401 for a request outside :data:`OPEN_PATHS` without the token."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode("latin-1")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers", ())).get(b"authorization")
        if sent is not None and hmac.compare_digest(sent, self._expected):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": MISSING if sent is None else WRONG}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"www-authenticate", b'Bearer realm="heddle-worker"'),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def document_auth(app: FastAPI) -> None:
    """Declare the token in the OpenAPI schema: a bearer scheme and a 401 on every guarded route."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        components = schema.setdefault("components", {})
        components.setdefault("securitySchemes", {})[_SCHEME] = {
            "type": "http",
            "scheme": "bearer",
            "description": "the pool's token, when the worker has one (docs/worker-api.md)",
        }
        for path, operations in schema.get("paths", {}).items():
            if path in OPEN_PATHS:
                continue
            for operation in operations.values():
                operation["security"] = [{_SCHEME: []}]
                operation.setdefault("responses", {})["401"] = {
                    "description": "no token, or not this worker's",
                    "content": {
                        "application/json": {
                            "schema": {"$ref": "#/components/schemas/ErrorResponse"}
                        }
                    },
                }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
