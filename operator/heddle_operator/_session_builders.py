"""Pure builders of a RolloutJob's session pod and its least-privilege RBAC.

The session pod runs ``heddle session`` for one job in the job's namespace,
owned by the job; without ``spec.session.serviceAccountName`` it runs as
``heddle-session``, whose Role lets it read jobs and pools, patch jobs'
status, read task ConfigMaps and post Events, and nothing else (the worker
token reaches it through a ``secretKeyRef``, so it needs no Secret access).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import kopf

from heddle.api import ENGINEPOOL_PLURAL, GROUP, LABEL_JOB, ROLLOUTJOB_PLURAL, RolloutJobSpec
from heddle.rollout import ALLOWED_HOSTS_ENV, GATEWAY_TOKEN_ENV, HostAllowList, SessionConfig

from ._tokens import TOKEN_KEY, token_env

__all__ = [
    "GATEWAY_PORT",
    "LABEL_JOB",
    "SESSION_ACCOUNT",
    "SESSION_CONFIG_ENV",
    "SessionPodOptions",
    "gateway_objects",
    "gateway_secret_name",
    "gateway_url",
    "session_pod",
    "session_rbac",
]

SESSION_ACCOUNT = "heddle-session"
SESSION_CONFIG_ENV = "HEDDLE_SESSION_CONFIG"  # the control loop's knobs, JSON
DEFAULT_SESSION_IMAGE = "ghcr.io/heddle-dev/heddle-operator:latest"
TMP_VOLUME = "heddle-tmp"  # /tmp on a read-only root
GATEWAY_PORT = 8080  # an external job's gateway, in its session pod
# A job without spec.session.resources: about the operator's old share for one job
# (~1 ms of CPU per step, ~50 KiB per running trajectory; docs/benchmarks.md).
DEFAULT_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "500m", "memory": "512Mi"},
    "limits": {"memory": "4Gi"},
}

# What the session pod does through the API, and nothing more.
SESSION_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [GROUP], "resources": [ROLLOUTJOB_PLURAL, ENGINEPOOL_PLURAL],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": [GROUP], "resources": [f"{ROLLOUTJOB_PLURAL}/status"],
     "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)  # fmt: skip


@dataclass(frozen=True)
class SessionPodOptions:
    """What the operator puts in every session pod (its own settings, passed on)."""

    image: str = DEFAULT_SESSION_IMAGE  # a job's spec.session.image wins
    base_dir: Path = Path("/data")  # relative paths of a job resolve inside it
    status_interval_s: float = 1.0
    metrics_port: int = 0  # the session's Prometheus port; 0: off
    session: SessionConfig = field(default_factory=SessionConfig)
    tool_hosts: HostAllowList | None = None  # where tool calls may go; None: anywhere


def _owner(body: Mapping[str, Any]) -> dict[str, Any]:
    return dict(kopf.build_owner_reference(kopf.Body(cast(kopf.RawBody, dict(body)))))


def session_pod(
    job: RolloutJobSpec, job_body: Mapping[str, Any], options: SessionPodOptions
) -> dict[str, Any]:
    """The pod that runs ``job``'s session (a fresh name each time: a replacement never
    waits for its predecessor's name)."""
    s = job.session
    env: list[dict[str, Any]] = [
        token_env(job.engine_pool),
        {"name": SESSION_CONFIG_ENV, "value": json.dumps(asdict(options.session))},
    ]
    if options.tool_hosts is not None:
        env.append({"name": ALLOWED_HOSTS_ENV, "value": options.tool_hosts.text()})
    external = job.environment.type == "external"
    if external:  # the agents' token, from the job's own Secret (gateway_objects)
        env.append({"name": GATEWAY_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
            "name": gateway_secret_name(job.name), "key": TOKEN_KEY}}})  # fmt: skip
    container: dict[str, Any] = {
        "name": "session",
        "image": s.image or options.image,
        "command": [
            "heddle", "session", "--namespace", job.namespace, "--job", job.name,
            "--base-dir", str(options.base_dir),
            "--status-interval", str(options.status_interval_s),
            "--metrics-port", str(options.metrics_port),
            *(["--gateway-host", "0.0.0.0", "--gateway-port", str(GATEWAY_PORT)]
              if external else []),
        ],
        "env": env,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,  # it writes only the job's output, on its volumes
        },
        "resources": dict(s.resources) or DEFAULT_RESOURCES,
        "volumeMounts": [{"name": TMP_VOLUME, "mountPath": "/tmp"},
                         *(dict(m) for m in s.volume_mounts)],
    }  # fmt: skip
    ports = (
        [{"name": "metrics", "containerPort": options.metrics_port}] if options.metrics_port else []
    )
    if external:
        ports.append({"name": "gateway", "containerPort": GATEWAY_PORT})
    if ports:
        container["ports"] = ports
    spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",  # the operator replaces a failed session pod itself
        "serviceAccountName": s.service_account_name or SESSION_ACCOUNT,
        # The operator image's user (Dockerfile, USER 10001); fsGroup lets it write the
        # job's output on volumes that honour it.
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }  # fmt: skip
    spec["volumes"] = [{"name": TMP_VOLUME, "emptyDir": {}}, *(dict(v) for v in s.volumes)]
    if s.node_selector:
        spec["nodeSelector"] = dict(s.node_selector)
    if s.tolerations:
        spec["tolerations"] = [dict(t) for t in s.tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{job.name}-session-",
            "namespace": job.namespace,
            "labels": {LABEL_JOB: job.name, "app.kubernetes.io/name": "heddle-session"},
            "ownerReferences": [_owner(job_body)],
        },
        "spec": spec,
    }


def gateway_secret_name(job: str) -> str:
    return f"{job}-gateway-token"


def gateway_url(job: RolloutJobSpec) -> str:
    """Where agents in the cluster reach an external job's gateway (its Service)."""
    return f"http://{job.name}-gateway.{job.namespace}.svc:{GATEWAY_PORT}/v1"


def gateway_objects(
    job: RolloutJobSpec, job_body: Mapping[str, Any], token: str
) -> list[tuple[str, dict[str, Any]]]:
    """(plural, object) of an external job's gateway: the Secret with the agents' token and
    the Service in front of the session pod, both owned by the job (they go with it)."""
    meta = {"namespace": job.namespace, "labels": {LABEL_JOB: job.name},
            "ownerReferences": [_owner(job_body)]}  # fmt: skip
    secret = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {**meta, "name": gateway_secret_name(job.name)},
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }  # fmt: skip
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {**meta, "name": f"{job.name}-gateway"},
        "spec": {"selector": {LABEL_JOB: job.name},
                 "ports": [{"name": "gateway", "port": GATEWAY_PORT,
                            "targetPort": GATEWAY_PORT}]},
    }  # fmt: skip
    return [("secrets", secret), ("services", service)]


def session_rbac(namespace: str) -> list[tuple[str, dict[str, Any]]]:
    """(plural, object) of the ServiceAccount, Role and RoleBinding of session pods."""
    labels = {"app.kubernetes.io/name": "heddle-session", "app.kubernetes.io/managed-by": "heddle"}
    meta = {"name": SESSION_ACCOUNT, "namespace": namespace, "labels": labels}
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        ("serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}),
        ("roles", {"apiVersion": rbac, "kind": "Role", "metadata": meta,
                   "rules": [dict(r) for r in SESSION_RULES]}),
        ("rolebindings", {
            "apiVersion": rbac, "kind": "RoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": SESSION_ACCOUNT},
            "subjects": [{"kind": "ServiceAccount", "name": SESSION_ACCOUNT,
                          "namespace": namespace}],
        }),
    ]  # fmt: skip
