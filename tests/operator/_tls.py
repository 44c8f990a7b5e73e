"""The test API server behind TLS, and kubeconfigs for it as kind and managed clusters write them.

kmock's ``Server`` listens through aiohttp's ``RawTestServer``, which serves
TLS when its ``start_server`` gets ``ssl=``; kmock has no option for it but
takes the server class (``server_cls``), so ``_TlsServer`` passes the context
there. Certificates come from ``trustme``: a CA, a server certificate for
127.0.0.1 and localhost, and a client certificate the server requires.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp.test_utils
import kmock
import trustme
import yaml

from ._cluster import ApiServer


class _TlsServer(aiohttp.test_utils.RawTestServer):
    def __init__(self, handler: Any, *, tls: ssl.SSLContext, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._tls = tls

    async def start_server(self, loop: Any = None, **kwargs: Any) -> None:
        await super().start_server(loop=loop, ssl=self._tls, **kwargs)


@contextlib.asynccontextmanager
async def tls_server(api: ApiServer, ca: trustme.CA) -> AsyncIterator[str]:
    """Serve ``api`` over HTTPS with a certificate from ``ca``, requiring a client certificate
    signed by ``ca``; yields the URL."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    ca.configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED
    server_cls = functools.partial(_TlsServer, tls=context)
    async with kmock.Server(api, server_cls=server_cls) as server:
        yield str(server.url).rstrip("/")


def client_context(ca: trustme.CA, client: trustme.LeafCert) -> ssl.SSLContext:
    """What the test itself uses to talk to the server (the operator uses a kubeconfig)."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    client.configure_cert(context)
    return context


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_kubeconfig(
    path: Path,
    server: str,
    ca: trustme.CA,
    client: trustme.LeafCert | None = None,
    user: dict[str, Any] | None = None,
) -> Path:
    """A kubeconfig with inline CA data, and inline client certificate data when given."""
    entry: dict[str, Any] = dict(user or {})
    if client is not None:
        entry["client-certificate-data"] = _b64(client.cert_chain_pems[0].bytes())
        entry["client-key-data"] = _b64(client.private_key_pem.bytes())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": server, "certificate-authority-data": _b64(ca.cert_pem.bytes()),
        }}],
        "users": [{"name": "test", "user": entry}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


_PLUGIN = """\
import datetime, json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
with (folder / "calls").open("a") as calls:
    calls.write("x")
expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=float(sys.argv[2]))
print(json.dumps({
    "apiVersion": "client.authentication.k8s.io/v1beta1",
    "kind": "ExecCredential",
    "status": {
        "token": (folder / "token").read_text().strip(),
        "expirationTimestamp": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
    },
}))
"""


def exec_plugin(folder: Path, token: str, lifetime_s: float) -> dict[str, Any]:
    """A kubeconfig user whose token comes from an exec plugin, as EKS, GKE and AKS write them.

    The plugin answers the token in ``folder/token`` (rewrite it to rotate), valid for
    ``lifetime_s``, and counts its calls in ``folder/calls``.
    """
    (folder / "token").write_text(token)
    (folder / "calls").write_text("")
    script = folder / "plugin.py"
    script.write_text(_PLUGIN)
    return {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": sys.executable,
        "args": [str(script), str(folder), json.dumps(lifetime_s)],
        "interactiveMode": "Never",
    }}  # fmt: skip


def plugin_calls(folder: Path) -> int:
    return len((folder / "calls").read_text())
