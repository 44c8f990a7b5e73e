"""Each EnginePool's worker token: a Secret the operator makes, pods read, the session sends.

The Secret ``<pool>-worker-token`` holds 32 random bytes (URL-safe base64,
key ``token``) and is owned by the pool, so it goes when the pool goes. A
Secret of that name that already exists is used only if the pool owns it (a
controller owner reference to the pool's uid): one someone else made would
hand its author the token every worker and session of the pool trusts. An
admin who provisions the token (e.g. from an external secret store) adds that
owner reference. Pods carry a digest of the token
in their spec hash, so a new token (the Secret deleted and made again)
replaces the instances the way a spec change does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from heddle.api import API_VERSION, LABEL_POOL
from heddle.worker import TOKEN_ENV

from ._kube import SECRETS, ApiError, KubeClient

__all__ = [
    "TOKEN_KEY",
    "TokenState",
    "ensure_worker_token",
    "read_worker_token",
    "token_digest",
    "token_env",
    "token_secret",
    "token_secret_name",
]

log = logging.getLogger("heddle.operator.tokens")
TOKEN_KEY = "token"


def token_secret_name(pool: str) -> str:
    return f"{pool}-worker-token"


def token_env(pool: str) -> dict[str, Any]:
    """The worker container's env entry: the token from the pool's Secret (never optional)."""
    return {
        "name": TOKEN_ENV,
        "valueFrom": {"secretKeyRef": {"name": token_secret_name(pool), "key": TOKEN_KEY}},
    }


def token_digest(token: str | None) -> str:
    """A short digest for the pods' spec hash; never the token itself."""
    return "" if token is None else hashlib.sha256(token.encode()).hexdigest()[:12]


def token_secret(pool_body: Mapping[str, Any], token: str) -> dict[str, Any]:
    meta = pool_body["metadata"]
    name = meta["name"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": token_secret_name(name),
            "namespace": meta.get("namespace", "default"),
            "labels": {LABEL_POOL: name, "app.kubernetes.io/name": "heddle-worker"},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "EnginePool",
                    "name": name,
                    "uid": meta.get("uid", ""),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def _decoded(secret: Mapping[str, Any]) -> str | None:
    raw = (secret.get("data") or {}).get(TOKEN_KEY)
    if not isinstance(raw, str):
        return None
    try:
        token = base64.b64decode(raw, validate=True).decode("ascii").strip()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return token or None


def _owned(obj: Mapping[str, Any], uid: str | None) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return uid is not None and any(r.get("uid") == uid and r.get("controller") for r in refs)


@dataclass(frozen=True)
class TokenState:
    """The pool's token, or why there is none (a sentence for the pool's Degraded condition)."""

    token: str | None
    problem: str | None = None


async def read_worker_token(kube: KubeClient, namespace: str, pool: str) -> str | None:
    """The token the pool's workers hold, or None when the Secret or its key is missing."""
    secret = await kube.get(SECRETS, namespace, token_secret_name(pool))
    return None if secret is None else _decoded(secret)


async def ensure_worker_token(kube: KubeClient, pool_body: Mapping[str, Any]) -> TokenState:
    """Read the pool's Secret; create it with a fresh token when it does not exist."""
    meta = pool_body["metadata"]
    namespace, pool = meta.get("namespace", "default"), meta["name"]
    name = token_secret_name(pool)
    secret = await kube.get(SECRETS, namespace, name)
    if secret is None:
        try:
            secret = await kube.create(
                SECRETS, namespace, token_secret(pool_body, secrets.token_urlsafe(32))
            )
            await kube.event(pool_body, "TokenCreated", f"created Secret {name} for its workers")
        except ApiError as exc:
            if exc.status != 409:  # 409: made meanwhile (another round); read it below
                log.warning("EnginePool %s/%s: cannot create Secret %s: %s",
                            namespace, pool, name, exc)  # fmt: skip
                return TokenState(None, (
                    f"cannot create Secret {name} for the workers' token ({exc}); let the "
                    "operator create secrets in this namespace (the chart's RBAC does) or "
                    f"create it yourself with a key {TOKEN_KEY!r}"
                ))  # fmt: skip
            secret = await kube.get(SECRETS, namespace, name)
    if secret is not None and not _owned(secret, meta.get("uid")):
        return TokenState(None, (
            f"Secret {name} exists but the pool does not own it (no controller owner reference "
            "to this EnginePool), so its token is not used: delete it and the operator makes "
            "one, or add that owner reference (docs/security.md)"
        ))  # fmt: skip
    token = None if secret is None else _decoded(secret)
    if token is None:
        return TokenState(None, (
            f"Secret {name} has no base64 key {TOKEN_KEY!r} holding a token; delete it "
            "and the operator makes a new one"
        ))  # fmt: skip
    return TokenState(token)
