"""The operator's Kubernetes API client, on the official ``kubernetes`` package.

kopf watches and patches the objects it handles; the operator also creates
and deletes Pods and a Service, patches status from long-running daemons,
reads ConfigMaps and posts Events, and a trainer's ``heddle.client`` creates
and reads RolloutJobs. Those calls go through this facade.

Credentials come from ``kubernetes.config`` exactly as kopf's
``login_via_client`` reads them (the in-cluster service account, else the
kubeconfig): inline ``certificate-authority-data``, client certificates,
token files and exec plugins all work, and a token is refreshed when it
expires (the package's refresh hook) or when the server answers 401 (the
configuration is read again, once, and the request repeated).

Why the synchronous client through :func:`asyncio.to_thread`: it is the one
whose loader kopf's ``login_via_client`` uses, so kopf and this client read
credentials through one code path, and the operator makes a few calls a
second, so a thread per call costs nothing that matters. Why
``ApiClient.param_serialize``/``call_api`` rather than ``CoreV1Api`` and
``CustomObjectsApi``: one path for core and custom resources, bodies stay
the plain JSON the rest of the operator builds (no model round trip that
drops fields), and patches are JSON merge patches for both, which CRDs need.

Lists are paginated (``limit``/``continue``); 429, and 5xx answers that
carry ``Retry-After``, are retried with bounded backoff. Every failure
leaves as :class:`ApiError` (one sentence, ``.status`` 0 when no HTTP answer
came), mapped in :meth:`KubeClient._send` and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import kubernetes.config
import urllib3
from kubernetes.client.exceptions import ApiException

from heddle.api import ENGINEPOOL_PLURAL, GROUP, ROLLOUTJOB_PLURAL, VERSION
from heddle.exceptions import ConfigError, KubeApiError

__all__ = ["ApiError", "KubeClient", "Resource", "RetryPolicy", "load_configuration"]


ApiError = KubeApiError  # its name before it moved to heddle.exceptions


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str

    def path(self, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}"
        if name is not None:
            path += f"/{name}"
        if sub is not None:
            path += f"/{sub}"
        return path


PODS = Resource("", "v1", "pods")
SERVICES = Resource("", "v1", "services")
CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
EVENTS = Resource("", "v1", "events")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts")
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings")
NETWORKPOLICIES = Resource("networking.k8s.io", "v1", "networkpolicies")
ENGINEPOOLS = Resource(GROUP, VERSION, ENGINEPOOL_PLURAL)
ROLLOUTJOBS = Resource(GROUP, VERSION, ROLLOUTJOB_PLURAL)


@dataclass(frozen=True)
class RetryPolicy:
    """How throttled requests (429, or 5xx with ``Retry-After``) are retried; times in seconds."""

    retries: int = 5  # then the request fails with ApiError
    first_wait_s: float = 0.5  # doubled each retry when the server names no Retry-After
    max_wait_s: float = 10.0  # a longer Retry-After is cut to this
    timeout_s: float = 30.0  # one request, connect to last byte
    page_size: int = 500  # items per LIST page (kubectl's chunk size)


def load_configuration(
    kubeconfig: str | None = None, context: str | None = None
) -> kubernetes.client.Configuration:
    """Credentials as kopf's ``login_via_client`` reads them: in-cluster, else the kubeconfig.

    ``kubeconfig`` names a file and skips the in-cluster check; by default the
    file is ``KUBECONFIG`` or ``~/.kube/config``. A token from an exec plugin
    with an expiry is refreshed by the package before each request after it.
    """
    cfg = kubernetes.client.Configuration()
    if kubeconfig is None:
        try:
            kubernetes.config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return cfg
        except kubernetes.config.ConfigException:
            pass  # not in a pod: the kubeconfig, as kubectl does
    try:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=cfg, persist_config=False
        )
    except (kubernetes.config.ConfigException, OSError, ValueError, KeyError) as exc:
        where = kubeconfig or "KUBECONFIG or ~/.kube/config"
        raise ConfigError(
            f"no Kubernetes credentials: not in a pod with a service account, and the "
            f"kubeconfig ({where}) cannot be used ({exc}); point KUBECONFIG at a working file"
        ) from None
    return cfg


def _from_access(info: Any) -> kubernetes.client.Configuration:
    """A configuration from a ``kopf.ConnectionInfo`` or a ``ClusterAccess`` (their attributes)."""
    cfg = kubernetes.client.Configuration(host=str(info.server).rstrip("/"))
    token = getattr(info, "token", None)
    if token:
        cfg.api_key["BearerToken"] = f"{getattr(info, 'scheme', None) or 'Bearer'} {token}"
    if getattr(info, "ca_path", None):
        cfg.ssl_ca_cert = str(info.ca_path)
    ca_data = getattr(info, "ca_data", None)
    if ca_data:
        cfg.ca_cert_data = ca_data.decode() if isinstance(ca_data, bytes) else ca_data
    if getattr(info, "certificate_data", None) or getattr(info, "private_key_data", None):
        raise ConfigError(
            "a client certificate given as data is not supported here; give its file paths, "
            "or KubeClient() to read the kubeconfig (inline data included)"
        )
    if getattr(info, "certificate_path", None) and getattr(info, "private_key_path", None):
        cfg.cert_file, cfg.key_file = str(info.certificate_path), str(info.private_key_path)
    cfg.verify_ssl = not getattr(info, "insecure", False)
    return cfg


def _reason(exc: BaseException) -> str:
    """What went wrong below HTTP, in words (urllib3 nests the cause in ``reason``)."""
    cause: BaseException = exc
    while isinstance(getattr(cause, "reason", None), BaseException):
        cause = cause.reason  # type: ignore[attr-defined]
    text = str(cause) or type(cause).__name__
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (
            f"the TLS handshake failed ({text[:200]}); the server's certificate is not signed "
            "by the kubeconfig's certificate-authority(-data): fix that field"
        )
    if isinstance(cause, urllib3.exceptions.SSLError) or "SSL" in text or "certificate" in text:
        return (
            f"the TLS handshake failed ({text[:200]}); check the kubeconfig's "
            "certificate-authority and client certificate"
        )
    if "closed connection without response" in text:
        # TLS 1.3 servers refuse a missing client certificate after the client's handshake.
        return (
            "the server closed the connection without an answer; if it requires a client "
            "certificate, set client-certificate(-data) and client-key(-data) in the kubeconfig"
        )
    return f"no answer ({type(cause).__name__}: {text[:200]})"


class KubeClient:
    """Requests to one API server.

    ``info`` is a ``kopf.ConnectionInfo`` or ``ClusterAccess`` (server and
    credentials), a ``kubernetes.client.Configuration``, or None: the
    in-cluster service account else the kubeconfig (:func:`load_configuration`),
    read again when the server refuses a token.
    """

    def __init__(self, info: Any = None, *, retry: RetryPolicy | None = None) -> None:
        self._retry = retry or RetryPolicy()
        self._reload: Callable[[], kubernetes.client.Configuration] | None = None
        if info is None:
            self._reload = load_configuration
            cfg = load_configuration()
        elif isinstance(info, kubernetes.client.Configuration):
            cfg = info
        else:
            cfg = _from_access(info)
        self._api = kubernetes.client.ApiClient(cfg)
        self.server = str(cfg.host)

    @classmethod
    def from_kubeconfig(
        cls,
        path: str | os.PathLike[str],
        context: str | None = None,
        *,
        retry: RetryPolicy | None = None,
    ) -> KubeClient:
        """A client for ``path``'s context (the current one by default), read again on a 401."""
        load = functools.partial(load_configuration, os.fspath(path), context)
        client = cls(load(), retry=retry)
        client._reload = load
        return client

    async def aclose(self) -> None:
        await asyncio.to_thread(self._api.close)

    def _request(
        self, method: str, path: str, query: list[tuple[str, str]], body: Any, kind: str
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One HTTP exchange, in a worker thread: status, headers, body."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = kind
        m, url, h, b, _ = self._api.param_serialize(
            method, path, query_params=query, header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )  # fmt: skip
        reply = self._api.call_api(m, url, h, b, _request_timeout=self._retry.timeout_s)
        raw = reply.response  # urllib3's response: read in full (preload_content is off)
        return int(reply.status), dict(raw.headers), bytes(raw.data or b"")

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        kind: str = "application/json",
    ) -> Any:
        """The one place where transport errors and HTTP statuses become :class:`ApiError`."""
        retry, waited, reloaded, attempt = self._retry, 0.0, False, 0
        while True:
            try:
                status, headers, data = await asyncio.to_thread(
                    self._request, method, path, list(query or []), body, kind
                )
            except ApiException as exc:  # the package's own transport errors carry status 0
                raise ApiError(int(exc.status or 0), f"{method} {path}: {_reason(exc)}") from None
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise ApiError(0, f"{method} {path} at {self.server}: {_reason(exc)}") from None
            if status == 401 and self._reload is not None and not reloaded:
                # An expired or rotated token: read the credentials again, once.
                reloaded = True
                await self._renew()
                continue
            wait = _retry_after(status, headers)
            if wait is not None and attempt < retry.retries:
                wait = min(wait or retry.first_wait_s * 2**attempt, retry.max_wait_s)
                waited += wait
                attempt += 1
                await asyncio.sleep(wait)
                continue
            if status >= 400:
                raise ApiError(status, _failure(method, path, status, data, attempt, waited))
            return json.loads(data) if data else None

    async def _renew(self) -> None:
        assert self._reload is not None
        try:
            cfg = await asyncio.to_thread(self._reload)
        except ConfigError as exc:
            raise ApiError(401, f"the token was refused and cannot be renewed: {exc}") from None
        old, self._api = self._api, kubernetes.client.ApiClient(cfg)
        await asyncio.to_thread(old.close)

    async def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self._send("GET", resource.path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def list(
        self, resource: Resource, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Every object, page by page; a page token that expired (410) starts the list again."""
        base = [("limit", str(self._retry.page_size))]
        if labels:
            base.append(("labelSelector", ",".join(f"{k}={v}" for k, v in labels.items())))
        items: list[dict[str, Any]] = []
        token, restarted = "", False
        while True:
            query = base + ([("continue", token)] if token else [])
            try:
                page = await self._send("GET", resource.path(namespace), query=query) or {}
            except ApiError as exc:
                if exc.status != 410 or not token or restarted:
                    raise
                items, token, restarted = [], "", True
                continue
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                break
        if labels:  # a server that ignores the selector is still answered correctly
            items = [i for i in items if _has_labels(i, labels)]
        return items

    async def create(self, resource: Resource, namespace: str, body: Mapping[str, Any]) -> Any:
        return await self._send("POST", resource.path(namespace), body=dict(body))

    async def delete(self, resource: Resource, namespace: str, name: str) -> None:
        try:
            await self._send("DELETE", resource.path(namespace, name))
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        status: bool = False,
    ) -> Any:
        return await self._send(
            "PATCH",
            resource.path(namespace, name, "status" if status else None),
            body=dict(patch),
            kind="application/merge-patch+json",
        )

    async def event(
        self, obj: Mapping[str, Any], reason: str, message: str, *, warning: bool = False
    ) -> None:
        """Post an Event about ``obj`` (best effort: a failure here never stops a reconcile)."""
        meta = obj.get("metadata", {})
        now = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
        namespace = meta.get("namespace", "default")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'heddle')}-", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1000],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "heddle-operator"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with contextlib.suppress(ApiError):
            await self.create(EVENTS, namespace, body)


def _has_labels(obj: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


def _retry_after(status: int, headers: Mapping[str, str]) -> float | None:
    """Seconds to wait before a retry (0: back off on our own), or None: do not retry."""
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if status != 429 and not (status >= 500 and value is not None):
        return None
    try:
        return max(0.0, float(value)) if value is not None else 0.0
    except ValueError:  # an HTTP date: rare from an API server; back off on our own
        return 0.0


def _failure(method: str, path: str, status: int, data: bytes, attempt: int, waited: float) -> str:
    try:
        message = str(json.loads(data).get("message") or "")
    except (ValueError, AttributeError):
        message = data.decode("utf-8", "replace")
    message = message.strip()[:300] or "no message"
    if status == 401:
        return (
            f"{method} {path}: the API server refused the credentials ({message}); check the "
            "kubeconfig's user (token, client certificate) or the service account"
        )
    if status == 429 or (status >= 500 and attempt):
        return (
            f"{method} {path}: the API server is still overloaded after {attempt} retries over "
            f"{waited:.1f} s ({message}); retry later"
        )
    return f"{method} {path}: {message}"
