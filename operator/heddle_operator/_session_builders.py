"""Pure builders of a RolloutJob's session pod and its least-privilege RBAC.

The session pod runs ``heddle session`` for one job in the job's namespace,
owned by the job; without ``spec.session.serviceAccountName`` it runs as
the job's own ServiceAccount ``<job>-session``, whose Role lets it read its
job and its pool, patch its job's status, read the job's task ConfigMap and
post Events, and nothing else: every rule but the Events one names its
objects (``resourceNames``), so one job's session cannot touch another's
status (the worker token reaches it through a ``secretKeyRef``, so it needs
no Secret access). The account, Role and RoleBinding are owned by the job and
go with it. A job with ``spec.asynchrony.trainerApi`` also gets the trainer API's
token Secret and ClusterIP Service (:func:`trainer_objects`): their names come
from the job's name only, in the job's namespace, so nothing a tenant sets picks
another Secret, another namespace or a Service reachable from outside.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import kopf

from heddle.api import (
    ENGINEPOOL_PLURAL,
    GROUP,
    LABEL_JOB,
    ROLLOUTJOB_PLURAL,
    PodPolicy,
    RolloutJobSpec,
    check_session_policy,
)
from heddle.rollout import (
    ALLOWED_HOSTS_ENV,
    CPUS_ENV,
    DATA_ROOT,
    GATEWAY_TOKEN_ENV,
    TRAINER_TOKEN_ENV,
    HostAllowList,
    SessionConfig,
)
from heddle.scheduler.sim import DECISION_WORKERS

from ._tokens import TOKEN_KEY, token_env

__all__ = [
    "GATEWAY_PORT",
    "LABEL_JOB",
    "SESSION_ACCOUNT",
    "SESSION_CONFIG_ENV",
    "SESSION_LABEL",
    "SESSION_METRICS_PORT",
    "TRAINER_PORT",
    "SessionPodOptions",
    "gateway_objects",
    "gateway_secret_name",
    "gateway_url",
    "serves_trainer",
    "session_account",
    "session_pod",
    "session_rbac",
    "trainer_objects",
    "trainer_secret_name",
    "trainer_url",
]

SESSION_ACCOUNT = "heddle-session"  # app.kubernetes.io/name of session pods and their RBAC
SESSION_LABEL = {"app.kubernetes.io/name": SESSION_ACCOUNT}
SESSION_CONFIG_ENV = "HEDDLE_SESSION_CONFIG"  # the control loop's knobs, JSON
DEFAULT_SESSION_IMAGE = "ghcr.io/heddle-dev/heddle-operator:latest"
TMP_VOLUME = "heddle-tmp"  # /tmp on a read-only root
GATEWAY_PORT = 8080  # an external job's gateway, in its session pod
SESSION_METRICS_PORT = 9090  # each session pod's Prometheus port (`--session-metrics-port`)
TRAINER_PORT = 8081  # a job's trainer API (spec.asynchrony.trainerApi), in its session pod
# A job without spec.session.resources: a CPU for each process its start-up decisions
# simulate on (DECISION_WORKERS; the loop itself takes ~1 ms of CPU per step), and
# memory for the session (~50 KiB per running trajectory; docs/benchmarks.md) and
# those processes (~100 MB each at 2,048 trajectories a simulation).
DEFAULT_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": str(DECISION_WORKERS), "memory": "1Gi"},
    "limits": {"memory": "4Gi"},
}


def session_rules(job: RolloutJobSpec) -> list[dict[str, Any]]:
    """What ``job``'s session does through the API, and nothing more: its own job, its
    pool, its task ConfigMap (by name), Events (RBAC cannot name those)."""
    rules: list[dict[str, Any]] = [
        {"apiGroups": [GROUP], "resources": [ROLLOUTJOB_PLURAL], "verbs": ["get"],
         "resourceNames": [job.name]},
        {"apiGroups": [GROUP], "resources": [f"{ROLLOUTJOB_PLURAL}/status"],
         "verbs": ["get", "patch"], "resourceNames": [job.name]},
        {"apiGroups": [GROUP], "resources": [ENGINEPOOL_PLURAL], "verbs": ["get"],
         "resourceNames": [job.engine_pool]},
    ]  # fmt: skip
    if job.tasks.config_map is not None:
        rules.append({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                      "resourceNames": [job.tasks.config_map[0]]})  # fmt: skip
    rules.append({"apiGroups": [""], "resources": ["events"], "verbs": ["create"]})
    return rules


def session_account(job: str) -> str:
    """The job's own ServiceAccount (and Role, RoleBinding): ``<job>-session``, cut with a
    digest where the job's name is too long for a name."""
    name = f"{job}-session"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(job.encode()).hexdigest()[:10]
    return f"{job[:234].rstrip('-.')}-{digest}-session"


@dataclass(frozen=True)
class SessionPodOptions:
    """What the operator puts in every session pod (its own settings, passed on).

    The one source of these defaults: :class:`~heddle.operator.OperatorConfig` (the
    operator's flags) and :class:`~heddle.operator.SessionPodConfig` (``heddle session``'s)
    take theirs from here.
    """

    image: str = DEFAULT_SESSION_IMAGE  # a job's spec.session.image wins
    base_dir: Path = DATA_ROOT  # relative paths of a job resolve inside it
    status_interval_s: float = 1.0  # status patches at most this often
    metrics_port: int = SESSION_METRICS_PORT  # the session's Prometheus port; 0: off
    session: SessionConfig = field(default_factory=SessionConfig)
    tool_hosts: HostAllowList = field(default_factory=HostAllowList)  # empty: nowhere
    policy: PodPolicy | None = None  # what spec.session may ask for (the operator's own)


def _owner(body: Mapping[str, Any]) -> dict[str, Any]:
    return dict(kopf.build_owner_reference(kopf.Body(cast(kopf.RawBody, dict(body)))))


def session_pod(
    job: RolloutJobSpec, job_body: Mapping[str, Any], options: SessionPodOptions
) -> dict[str, Any]:
    """The pod that runs ``job``'s session (a fresh name each time: a replacement never
    waits for its predecessor's name)."""
    s = job.session
    if options.policy is not None:
        check_session_policy(job, options.policy, session_account(job.name))
    env: list[dict[str, Any]] = [
        token_env(job.engine_pool),
        {"name": SESSION_CONFIG_ENV, "value": json.dumps(asdict(options.session))},
        # Always set: an empty list denies every tool host in the session too.
        {"name": ALLOWED_HOSTS_ENV, "value": options.tool_hosts.text()},
        # The CPUs the pod asked for, rounded up: its start-up decisions run on no more
        # worker processes than that (a node shows the session all its cores).
        {"name": CPUS_ENV, "valueFrom": {"resourceFieldRef": {
            "containerName": "session", "resource": "requests.cpu", "divisor": "1"}}},
    ]  # fmt: skip
    external = job.environment.type == "external"
    if external:  # the agents' token, from the job's own Secret (gateway_objects)
        env.append({"name": GATEWAY_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
            "name": gateway_secret_name(job.name), "key": TOKEN_KEY}}})  # fmt: skip
    trainer = serves_trainer(job)
    if trainer:  # the trainer's token, from the job's own Secret (trainer_objects)
        env.append({"name": TRAINER_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
            "name": trainer_secret_name(job.name), "key": TOKEN_KEY}}})  # fmt: skip
    container: dict[str, Any] = {
        "name": "session",
        "image": s.image or options.image,
        "command": [
            "heddle", "session", "--namespace", job.namespace, "--job", job.name,
            "--base-dir", str(options.base_dir),
            "--status-interval", str(options.status_interval_s),
            "--metrics-port", str(options.metrics_port),
            *(["--gateway-host", "0.0.0.0"] if external or trainer else []),
            *(["--gateway-port", str(GATEWAY_PORT)] if external else []),
            *(["--trainer-port", str(TRAINER_PORT)] if trainer else []),
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
    if trainer:
        ports.append({"name": "trainer", "containerPort": TRAINER_PORT})
    if ports:
        container["ports"] = ports
    spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",  # the operator replaces a failed session pod itself
        "serviceAccountName": s.service_account_name or session_account(job.name),
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
            "labels": {LABEL_JOB: job.name, **SESSION_LABEL},
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


def serves_trainer(job: RolloutJobSpec) -> bool:
    """Whether ``job``'s session pod serves the trainer API (``spec.asynchrony.trainerApi``)."""
    return job.asynchrony is not None and job.asynchrony.trainer_api


def trainer_secret_name(job: str) -> str:
    return f"{job}-trainer-token"


def trainer_url(job: str, namespace: str) -> str:
    """Where a trainer in the cluster reaches the job's trainer API (its Service)."""
    return f"http://{job}-trainer.{namespace}.svc:{TRAINER_PORT}"


def trainer_objects(
    job: RolloutJobSpec, job_body: Mapping[str, Any], token: str
) -> list[tuple[str, dict[str, Any]]]:
    """(plural, object) of the job's trainer API: the Secret with its bearer token and the
    ClusterIP Service in front of the session pod, both owned by the job (they go with it).
    ClusterIP always: the token guards a stream of the job's outputs and weight pushes,
    which stay inside the cluster."""
    meta = {"namespace": job.namespace, "labels": {LABEL_JOB: job.name},
            "ownerReferences": [_owner(job_body)]}  # fmt: skip
    secret = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {**meta, "name": trainer_secret_name(job.name)},
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }  # fmt: skip
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {**meta, "name": f"{job.name}-trainer"},
        "spec": {"type": "ClusterIP", "selector": {LABEL_JOB: job.name, **SESSION_LABEL},
                 "ports": [{"name": "trainer", "port": TRAINER_PORT,
                            "targetPort": TRAINER_PORT}]},
    }  # fmt: skip
    return [("secrets", secret), ("services", service)]


def session_rbac(
    job: RolloutJobSpec, job_body: Mapping[str, Any]
) -> list[tuple[str, dict[str, Any]]]:
    """(plural, object) of the job's ServiceAccount, Role and RoleBinding, owned by the job."""
    name = session_account(job.name)
    labels = {**SESSION_LABEL, "app.kubernetes.io/managed-by": "heddle", LABEL_JOB: job.name}
    meta = {"name": name, "namespace": job.namespace, "labels": labels,
            "ownerReferences": [_owner(job_body)]}  # fmt: skip
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        ("serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}),
        ("roles", {"apiVersion": rbac, "kind": "Role", "metadata": meta,
                   "rules": session_rules(job)}),
        ("rolebindings", {
            "apiVersion": rbac, "kind": "RoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.namespace}],
        }),
    ]  # fmt: skip
