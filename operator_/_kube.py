"""A small async Kubernetes API client for what the operator does beyond kopf's handlers.

kopf watches and patches the objects it handles; the operator also creates
and deletes Pods and a Service, patches status from long-running daemons,
reads ConfigMaps and posts Events. This client does exactly that over httpx,
with the credentials kopf logged in with (``kopf.ConnectionInfo``), so both
talk to the same API server the same way. Label selectors are applied on
the client side as well, so a server that ignores them is still correct.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from heddle.exceptions import HeddleError

__all__ = ["ApiError", "KubeClient", "Resource"]


class ApiError(HeddleError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API {status}: {message}")
        self.status = status


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
EVENTS = Resource("", "v1", "events")
SECRETS = Resource("", "v1", "secrets")
ENGINEPOOLS = Resource("heddle.dev", "v1alpha1", "enginepools")
ROLLOUTJOBS = Resource("heddle.dev", "v1alpha1", "rolloutjobs")


def _verify(info: Any) -> ssl.SSLContext | bool:
    if getattr(info, "insecure", False):
        return False
    ctx = ssl.create_default_context()
    if getattr(info, "ca_path", None):
        ctx.load_verify_locations(cafile=info.ca_path)
    elif getattr(info, "ca_data", None):
        data = info.ca_data
        ctx.load_verify_locations(cadata=data.decode() if isinstance(data, bytes) else data)
    if getattr(info, "certificate_path", None) and getattr(info, "private_key_path", None):
        ctx.load_cert_chain(info.certificate_path, info.private_key_path)
    return ctx


class KubeClient:
    """Requests to the API server in ``info`` (a ``kopf.ConnectionInfo``)."""

    def __init__(self, info: Any) -> None:
        headers = {"Accept": "application/json"}
        if getattr(info, "token", None):
            headers["Authorization"] = f"Bearer {info.token}"
        auth = None
        if getattr(info, "username", None) and getattr(info, "password", None):
            auth = (info.username, info.password)
        self._http = httpx.AsyncClient(
            base_url=str(info.server).rstrip("/"),
            headers=headers,
            auth=auth,
            verify=_verify(info),
            timeout=30.0,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            reply = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"{method} {path}: {type(exc).__name__} {exc}") from exc
        if reply.status_code >= 400:
            try:
                message = reply.json().get("message", reply.text)
            except ValueError:
                message = reply.text
            raise ApiError(reply.status_code, f"{method} {path}: {str(message)[:300]}")
        return reply.json() if reply.content else None

    async def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self._call("GET", resource.path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def list(
        self, resource: Resource, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        params = {}
        if labels:
            params["labelSelector"] = ",".join(f"{k}={v}" for k, v in labels.items())
        data = await self._call("GET", resource.path(namespace), params=params)
        items: list[dict[str, Any]] = (data or {}).get("items", [])
        if labels:
            items = [
                i
                for i in items
                if all(
                    ((i.get("metadata") or {}).get("labels") or {}).get(k) == v
                    for k, v in labels.items()
                )
            ]
        return items

    async def create(self, resource: Resource, namespace: str, body: Mapping[str, Any]) -> Any:
        return await self._call("POST", resource.path(namespace), json=dict(body))

    async def delete(self, resource: Resource, namespace: str, name: str) -> None:
        try:
            await self._call("DELETE", resource.path(namespace, name))
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
        return await self._call(
            "PATCH",
            resource.path(namespace, name, "status" if status else None),
            json=dict(patch),
            headers={"Content-Type": "application/merge-patch+json"},
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
