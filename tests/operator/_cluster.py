"""A Kubernetes API server over real HTTP (kmock) and a kubelet that runs real workers.

``ApiServer`` fakes the API server: kmock's emulator keeps objects and serves
lists, watches and patches; the subclass adds what kopf relies on and kmock
leaves out (uid, resourceVersion, generation, creationTimestamp,
generateName, status-subresource semantics, 409 on a stale resourceVersion).
Custom objects are validated against the CRD schemas in ``crds/`` on create
and update, CEL rules and list-map keys included (``_crd_rules``), as a real
server would (422 with the schema error or the rule's message). Lists honour
``?limit=`` with ``continue`` tokens; ``tokens`` and ``throttle`` make it
refuse unknown bearer tokens (401) and throttle (429 with ``Retry-After``).

``Kubelet`` fakes the node: it polls Pods through the same HTTP API, starts a
real ``heddle worker`` process (simulated engine) for each on its own
loopback address (127.x.y.2, 127.x.y.3, ... in a random /24 per kubelet) at the worker port, writes
podIP, phase Running and the Ready condition, and kills the process when the
Pod is deleted. The worker container's env is resolved as a kubelet does,
``valueFrom.secretKeyRef`` included: a missing Secret or key keeps the Pod
Pending with the container waiting in ``CreateContainerConfigError`` (the
kubelet's message) and a Warning Event, and the kubelet tries again each round.
It records the GPUs held after every change it observes, so tests can assert
the budget held at every moment.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import datetime as dt
import itertools
import math
import os
import random
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web
import httpx
import jsonschema
import kmock
import yaml

from heddle.api import LABEL_JOB  # a session pod: the kubelet runs `heddle session`
from heddle.rollout import die_with_parent
from heddle.worker import WorkerArgs, parse_worker_argv

from ._crd_rules import rule_errors

ROOT = Path(__file__).resolve().parents[2]
ADMIN_HEADER = "X-Test-As-Admin"
UNPULLABLE = "unpullable.invalid/"  # an image the test kubelet cannot pull (ErrImagePull)
CORE = (
    "pods", "services", "configmaps", "events", "secrets", "persistentvolumeclaims",
    "serviceaccounts",
)  # fmt: skip
RBAC = ("roles", "rolebindings")


def crd_schemas() -> dict[str, dict[str, Any]]:
    """plural -> the openAPIV3Schema of each CRD in crds/."""
    out = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        out[crd["spec"]["names"]["plural"]] = crd["spec"]["versions"][0]["schema"][
            "openAPIV3Schema"
        ]
    return out


def validate(plural: str, obj: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` if ``obj`` breaks its CRD schema or a CEL rule."""
    schema = crd_schemas()[plural]
    jsonschema.Draft4Validator(schema).validate(obj)
    errors = rule_errors(schema, obj)
    if errors:
        raise jsonschema.ValidationError("; ".join(errors))


class ApiServer(kmock.KubernetesEmulator):  # type: ignore[misc]
    """kmock's emulator plus server-side fields, status semantics and schema checks."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # Plurals the operator may not create, as with RBAC that lacks the verb (403);
        # a request with ADMIN_HEADER (a cluster admin's kubectl) still may.
        self.forbid_create: set[str] = set()
        self._rv = itertools.count(1)
        self._schemas = crd_schemas()
        # Knobs for the client's tests: accepted bearer tokens (None: no authentication),
        # how many next requests answer 429 with Retry-After, and what the server did.
        self.tokens: set[str] | None = None
        self.throttle = 0
        self.refused: list[str] = []  # the tokens answered 401
        self.throttled = 0  # requests answered 429
        self.continued = 0  # list pages served after the first (a ?continue= token)
        # (method, path, User-Agent, query) of each request
        self.seen: list[tuple[str, str, str, dict[str, str]]] = []
        for path in sorted((ROOT / "crds").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            names = crd["spec"]["names"]
            key = f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}/{names['plural']}"
            self.resources[key] = kmock.ResourceInfo(
                kind=names["kind"],
                singular=names["singular"],
                namespaced=True,
                shortnames=set(names.get("shortNames", [])),
                categories=set(names.get("categories", [])),
                subresources={"status"},
                verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            )
        self.resources["v1/namespaces"] = kmock.ResourceInfo(
            kind="Namespace", namespaced=False, verbs={"get", "list", "watch"}
        )
        kinds = {"configmaps": "ConfigMap", "persistentvolumeclaims": "PersistentVolumeClaim",
                 "serviceaccounts": "ServiceAccount", "roles": "Role",
                 "rolebindings": "RoleBinding"}  # fmt: skip
        for plural in CORE:
            self.resources[f"v1/{plural}"] = kmock.ResourceInfo(
                kind=kinds.get(plural, plural[:-1].capitalize()),
                namespaced=True,
                subresources={"status"} if plural == "pods" else set(),
                verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            )
        for plural in RBAC:
            self.resources[f"rbac.authorization.k8s.io/v1/{plural}"] = kmock.ResourceInfo(
                kind=kinds[plural],
                namespaced=True,
                verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            )
        self.resources["networking.k8s.io/v1/networkpolicies"] = kmock.ResourceInfo(
            kind="NetworkPolicy",
            namespaced=True,
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        )

    def _stored(self, request: Any) -> Any:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects:
            return None
        obj = self.objects[key]
        return None if obj.deleted else obj

    async def _handle(self, request: Any) -> Any:
        agent = next((v for k, v in request.headers.items() if k.lower() == "user-agent"), "")
        method = str(getattr(request.method, "value", request.method)).upper()
        self.seen.append((method, request.url.path, agent, dict(request.params)))
        refusal = self._refusal(request)
        if refusal is not None:
            return refusal
        if request.resource is not None and isinstance(request.data, dict):
            action = str(getattr(request.action, "value", request.action)).lower()
            plural = request.resource.plural
            rv = str(next(self._rv))
            if (
                action == "create"
                and plural in self.forbid_create
                and (ADMIN_HEADER.lower() not in {k.lower() for k in request.headers})
            ):
                raise kmock.KubernetesError(
                    status=403,
                    reason="Forbidden",
                    message=f'{plural} is forbidden: User "system:serviceaccount:heddle:heddle" '
                    f'cannot create resource "{plural}" in the namespace "{request.namespace}"',
                )
            if action == "create":
                meta = request.data.setdefault("metadata", {})
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                meta.update(
                    uid=str(uuid.uuid4()),
                    resourceVersion=rv,
                    generation=1,
                    creationTimestamp=dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
                )
                meta.setdefault("namespace", request.namespace or "default")
                if plural in self._schemas:
                    request.data.pop("status", None)
                    self._check(plural, request.data)
            elif action == "update" and request.name is not None:
                stored = self._stored(request)
                if stored is not None:
                    sent = (request.data.get("metadata") or {}).get("resourceVersion")
                    current = stored.get("metadata", {}).get("resourceVersion")
                    if sent is not None and sent != current:
                        raise kmock.KubernetesError(
                            status=409,
                            reason="Conflict",
                            message=f"stale resourceVersion {sent}; the object is at {current}",
                        )
                    on_status = request.subresource == "status"
                    if plural in self._schemas or plural == "pods":
                        if on_status:  # only status changes through /status
                            new_status = request.data.get("status")
                            request.data.clear()
                            request.data.update(status=new_status, metadata={})
                        else:
                            request.data.pop("status", None)
                    meta = request.data.setdefault("metadata", {})
                    meta["resourceVersion"] = rv
                    spec = request.data.get("spec")
                    if spec is not None and spec != stored.get("spec"):
                        meta["generation"] = (
                            int(stored.get("metadata", {}).get("generation", 1)) + 1
                        )
                    if plural in self._schemas:
                        merged = copy.deepcopy(_plain(stored))
                        _merge(merged, request.data)
                        self._check(plural, merged)
        return await super()._handle(request)

    def _refusal(self, request: Any) -> aiohttp.web.Response | None:
        """401 for a token not in ``tokens``, 429 while ``throttle`` lasts, as kube-apiserver."""
        if self.tokens is not None:
            header = next(
                (v for k, v in request.headers.items() if k.lower() == "authorization"), ""
            )
            token = header.removeprefix("Bearer ")
            if token not in self.tokens:
                self.refused.append(token)
                return _status(401, "Unauthorized", "Unauthorized")
        if self.throttle > 0:
            self.throttle -= 1
            self.throttled += 1
            return _status(
                429, "TooManyRequests", "too many requests, please try again later",
                {"Retry-After": "1"},
            )  # fmt: skip
        return None

    async def _serve_list(self, request: Any) -> Any:
        """kmock's list, in pages of ``?limit=`` with ``continue`` tokens, as a real server."""
        listing = await super()._serve_list(request)
        limit = int(request.params.get("limit") or 0)
        if limit <= 0:
            return listing
        start = int(request.params.get("continue") or 0)
        self.continued += start > 0
        items = sorted(
            listing["items"],
            key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]),
        )
        meta = dict(listing["metadata"])
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        return {**listing, "metadata": meta, "items": items[start : start + limit]}

    def _check(self, plural: str, obj: dict[str, Any]) -> None:
        try:
            jsonschema.Draft4Validator(self._schemas[plural]).validate(_plain(obj))
        except jsonschema.ValidationError as exc:
            where = ".".join(str(p) for p in exc.absolute_path)
            raise kmock.KubernetesError(
                status=422, reason="Invalid", message=f"{plural} {where}: {exc.message}"
            ) from None
        errors = rule_errors(self._schemas[plural], _plain(obj))
        if errors:
            raise kmock.KubernetesError(
                status=422, reason="Invalid", message=f"{plural}: {'; '.join(errors)}"
            )


def _status(
    code: int, reason: str, message: str, headers: dict[str, str] | None = None
) -> aiohttp.web.Response:
    body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
            "reason": reason, "message": message}  # fmt: skip
    return aiohttp.web.json_response(body, status=code, headers=headers)


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {k: _plain(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


@dataclass
class _Running:
    ip: str
    process: subprocess.Popen[bytes]
    uid: str = ""
    job: str = ""  # a session pod's job; empty for a worker


@dataclass
class Kubelet:
    """Plays the node for every Pod in ``namespace``; see the module docstring."""

    api: str
    log_dir: Path
    namespace: str = "default"
    time_scale: float = 0.02
    budget_log: list[int] = field(default_factory=list)  # GPUs held by pods, after each change
    running: dict[str, _Running] = field(default_factory=dict)
    # A random 127.x.y.0/24 per kubelet: workers of another test never answer in its place.
    _subnet: str = field(
        default_factory=lambda: f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"
    )
    _ips: itertools.count[int] = field(default_factory=lambda: itertools.count(2))
    _task: asyncio.Task[None] | None = None
    _reported: set[tuple[str, str]] = field(default_factory=set)  # (pod uid, message) evented

    async def __aenter__(self) -> Kubelet:
        self._http = httpx.AsyncClient(base_url=self.api, timeout=10)
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        finally:
            for run in self.running.values():
                self._kill(run)
            await self._http.aclose()

    def _kill(self, run: _Running) -> None:
        if run.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.process.pid, signal.SIGKILL)
            run.process.wait()

    def kill_worker(self, pod: str) -> None:
        """The container dies (the Pod then fails, as a real kubelet would report)."""
        self._kill(self.running[pod])

    async def _loop(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        last: tuple[tuple[str, int], ...] = ()
        while True:
            with contextlib.suppress(httpx.HTTPError):  # a slow API server: retry, as kubelets do
                last = await self._round(path, last)
            await asyncio.sleep(0.1)

    async def _round(
        self, path: str, last: tuple[tuple[str, int], ...]
    ) -> tuple[tuple[str, int], ...]:
        pods = (await self._http.get(path)).json().get("items", [])
        held = tuple(sorted(
            (p["metadata"]["name"], _gpus(p))
            for p in pods
        ))  # fmt: skip
        if held != last:
            self.budget_log.append(sum(g for _, g in held))
            last = held
        names = set()
        for pod in pods:
            name = pod["metadata"]["name"]
            names.add(name)
            await self._tend(pod)
        for gone in set(self.running) - names:
            self._kill(self.running.pop(gone))
        return last

    async def _tend(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        if pod["metadata"].get("deletionTimestamp"):
            return
        run = self.running.get(name)
        if run is not None and run.uid != pod["metadata"].get("uid"):
            # Deleted and created again under the same name between two polls: a new pod.
            self._kill(self.running.pop(name))
            run = None
        if LABEL_JOB in (pod["metadata"].get("labels") or {}):
            await self._tend_session(pod, run)
            return
        if run is None:
            if status.get("phase") in ("Failed", "Succeeded"):
                return
            env, problem = await self._env(pod)
            if problem is not None:
                await self._config_error(pod, problem)
                return
            ip = f"{self._subnet}.{next(self._ips)}"
            log = (self.log_dir / f"{name}.log").open("ab")
            process = subprocess.Popen(
                [sys.executable, "-m", "heddle", *self._worker_args(pod, ip).argv()],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - no worker outlives a killed test run
            )  # fmt: skip
            self.running[name] = _Running(ip, process, pod["metadata"].get("uid", ""))
            await self._status(name, {"phase": "Pending", "containerStatuses": [
                {"name": "worker", "ready": False, "state": {"running": {}}},
            ]})  # fmt: skip
            return
        if run.process.poll() is not None:
            if status.get("phase") != "Failed":
                await self._status(name, {"phase": "Failed", "reason": "Error"})
            return
        if status.get("phase") == "Running" and status.get("podIP"):
            return
        try:
            ready = (await self._http.get(f"http://{run.ip}:8000/readyz")).status_code == 200
        except httpx.HTTPError:
            ready = False
        if ready:
            await self._status(name, {
                "phase": "Running", "podIP": run.ip,
                "conditions": [{"type": "Ready", "status": "True"}],
            })  # fmt: skip

    def _worker_args(self, pod: dict[str, Any], ip: str) -> WorkerArgs:
        """The pod's own ``heddle worker`` command, on the simulated engine at this pod's IP.

        Parsing the command the operator wrote (rather than spelling another) makes every
        scenario check that the worker pod's command line is one ``heddle worker`` takes.
        """
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "worker"]
        command = [*container.get("command", []), *container.get("args", [])]
        assert command[:2] == ["heddle", "worker"], command
        args = parse_worker_argv(command[2:])
        # No GPU here: the simulated engine, with room for the scenarios' long contexts.
        return dataclasses.replace(
            args, engine="sim", model=None, host=ip, time_scale=self.time_scale,
            max_model_len=65_536, grace_s=1.0,
        )  # fmt: skip

    def kill_session(self, job: str) -> str:
        """The session container of ``job`` dies (SIGKILL); returns its pod's name."""
        for name, run in self.running.items():
            if run.job == job and run.process.poll() is None:
                self._kill(run)
                return name
        raise AssertionError(f"no running session pod of {job}")

    async def _tend_session(self, pod: dict[str, Any], run: _Running | None) -> None:
        """A session pod: ``heddle session`` as a process, with a kubeconfig for this server."""
        name, status = pod["metadata"]["name"], pod.get("status") or {}
        if run is not None:
            code = run.process.poll()
            if code is not None and status.get("phase") not in ("Failed", "Succeeded"):
                phase = "Succeeded" if code == 0 else "Failed"
                await self._status(name, {"phase": phase, "containerStatuses": [
                    {"name": "session", "ready": False,
                     "state": {"terminated": {"exitCode": code}}},
                ]})  # fmt: skip
            return
        if status.get("phase") in ("Failed", "Succeeded"):
            return
        container = pod["spec"]["containers"][0]
        if container["image"].startswith(UNPULLABLE):
            await self._config_error(pod, f'failed to pull image "{container["image"]}": '
                                     "not found", "ErrImagePull")  # fmt: skip
            return
        for volume in pod["spec"].get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim is None:
                continue
            reply = await self._http.get(
                f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{claim}"
            )
            if reply.status_code == 404:  # what the scheduler says of such a pod
                message = f'persistentvolumeclaim "{claim}" not found'
                if (status.get("conditions") or [{}])[0].get("message") != message:
                    await self._status(name, {"phase": "Pending", "conditions": [
                        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                         "message": message},
                    ]})  # fmt: skip
                return
        env, problem = await self._env(pod)
        if problem is not None:
            await self._config_error(pod, problem)
            return
        env["KUBECONFIG"] = str(self._kubeconfig())
        env["HEDDLE_LOG_LEVEL"] = "INFO"
        # The pod's own address, as for workers: a gateway bound to 0.0.0.0 in the pod
        # listens on its pod IP alone here, so two session pods never share a port.
        ip = f"{self._subnet}.{next(self._ips)}"
        command = [ip if a == "0.0.0.0" else a for a in container["command"][1:]]
        log = (self.log_dir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "heddle", *command],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - no session outlives a killed test run
        )  # fmt: skip
        job = pod["metadata"]["labels"][LABEL_JOB]
        self.running[name] = _Running(ip, process, pod["metadata"].get("uid", ""), job)
        await self._status(name, {"phase": "Running", "podIP": ip, "conditions": [
            {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"},
        ], "containerStatuses": [
            {"name": "session", "ready": True, "state": {"running": {}}},
        ]})  # fmt: skip

    def _kubeconfig(self) -> Path:
        """A kubeconfig naming this server, as a session pod's credentials stand in for."""
        path = self.log_dir / "kubeconfig.yaml"
        if not path.exists():
            path.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "test",
                "clusters": [{"name": "test", "cluster": {"server": self.api}}],
                "users": [{"name": "test", "user": {}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            }))  # fmt: skip
        return path

    async def _env(self, pod: dict[str, Any]) -> tuple[dict[str, str], str | None]:
        """The worker container's environment, or the kubelet's message for what is missing."""
        env = dict(os.environ)
        for entry in pod["spec"]["containers"][0].get("env") or []:
            if "value" in entry:
                env[entry["name"]] = str(entry["value"])
            resource = (entry.get("valueFrom") or {}).get("resourceFieldRef")
            if resource is not None:
                env[entry["name"]] = resource_field_value(pod, resource)
                continue
            ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
            if ref is None:
                continue  # other sources (fieldRef, configMapKeyRef) are not needed here
            reply = await self._http.get(
                f"/api/v1/namespaces/{self.namespace}/secrets/{ref['name']}"
            )
            if reply.status_code == 404:
                if ref.get("optional"):
                    continue
                return env, f'secret "{ref["name"]}" not found'
            reply.raise_for_status()
            data = reply.json().get("data") or {}
            if ref["key"] not in data:
                if ref.get("optional"):
                    continue
                return (
                    env,
                    f"couldn't find key {ref['key']} in Secret {self.namespace}/{ref['name']}",
                )
            env[entry["name"]] = base64.b64decode(data[ref["key"]]).decode()
        return env, None

    async def _config_error(
        self, pod: dict[str, Any], problem: str, reason: str = "CreateContainerConfigError"
    ) -> None:
        """What a kubelet reports for a container it cannot configure: waiting, and an Event."""
        name, uid = pod["metadata"]["name"], pod["metadata"].get("uid", "")
        waiting = {"reason": reason, "message": problem}
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        if (statuses[0].get("state") or {}).get("waiting") != waiting:
            await self._status(name, {"phase": "Pending", "containerStatuses": [
                {"name": pod["spec"]["containers"][0]["name"], "ready": False,
                 "state": {"waiting": waiting}},
            ]})  # fmt: skip
        if (uid, problem) not in self._reported:
            self._reported.add((uid, problem))
            await self._http.post(f"/api/v1/namespaces/{self.namespace}/events", json={
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{name}.", "namespace": self.namespace},
                "involvedObject": {"kind": "Pod", "name": name, "namespace": self.namespace,
                                   "uid": uid, "apiVersion": "v1"},
                "reason": "Failed", "type": "Warning", "message": f"Error: {problem}",
                "source": {"component": "kubelet"},
            })  # fmt: skip

    async def _status(self, name: str, status: dict[str, Any]) -> None:
        await self._http.patch(
            f"/api/v1/namespaces/{self.namespace}/pods/{name}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )


def _gpus(pod: dict[str, Any]) -> int:
    limits = (pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}
    return int(limits.get("nvidia.com/gpu", 0))  # a session pod holds none


def _cpus(quantity: str) -> float:
    """A CPU quantity ("2", "500m", "1.5") in cores."""
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def resource_field_value(pod: dict[str, Any], ref: dict[str, Any]) -> str:
    """A downward-API ``resourceFieldRef`` as the kubelet resolves it: the named
    container's CPU request or limit over the divisor, rounded up (0 where unset)."""
    containers = pod["spec"]["containers"]
    name = ref.get("containerName")
    container = next((c for c in containers if c["name"] == name), containers[0])
    kind, _, what = ref["resource"].partition(".")
    if what != "cpu":
        raise NotImplementedError(f"the test kubelet resolves CPU fields only, not {what!r}")
    amount = ((container.get("resources") or {}).get(kind) or {}).get("cpu")
    if amount is None:
        return "0"
    return str(math.ceil(_cpus(amount) / _cpus(ref.get("divisor", "1"))))
