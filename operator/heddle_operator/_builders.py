"""Pure functions from an EnginePool spec to the manifests and status the operator writes.

No I/O here: the handlers fetch, these build, the handlers apply. Tested on
their own (tests/operator/test_builders.py).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

import kopf

from heddle.api import (
    ANNOTATION_DRAINING,
    ANNOTATION_SPEC_HASH,
    LABEL_POOL,
    LABEL_TP,
    EnginePoolSpec,
    InstancePhase,
    PodPolicy,
    apply_pod_template,
    check_pool_policy,
)
from heddle.scheduler import PoolShape
from heddle.worker import WorkerArgs

from ._tokens import token_env

__all__ = [
    "LABEL_POOL",
    "LABEL_TP",
    "MAX_CONDITION_MESSAGE",
    "WORKER_PORT",
    "condition",
    "headless_service",
    "instance_name",
    "merge_conditions",
    "pod_phase",
    "shape_entries",
    "spec_hash",
    "worker_network_policy",
    "worker_pod",
]

WORKER_PORT = 8000
GPU = "nvidia.com/gpu"
SHM_VOLUME = "heddle-shm"


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def spec_hash(pool: EnginePoolSpec, token_digest: str = "") -> str:
    """What a pod must be rebuilt for: image, model, vLLM args, pod knobs, the pool's token
    (its digest: a new token replaces the instances), not the shape."""
    material = {
        "token": token_digest,
        "image": pool.image,
        "model": pool.model,
        "vllm": [pool.vllm.max_model_len, pool.vllm.gpu_memory_utilization, *pool.vllm.extra_args],
        "pod": pool.pod,
        "shm": pool.shm_size_limit,
        # Left out when off, so pools that never speculate keep their pods' hash.
        **(
            {"speculation": WorkerArgs.speculation_flags(pool.speculation)}
            if pool.speculation.on
            else {}
        ),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:12]


def instance_name(pool: str, tp: int, index: int) -> str:
    return f"{pool}-tp{tp}-{index}"


def _owner(pool_body: Mapping[str, Any]) -> dict[str, Any]:
    # kopf's own reference (what kopf.adopt appends): controller, blocking the owner's deletion.
    # Not kopf.adopt itself: it would copy the pool's labels (a GitOps tool's tracking label
    # among them) onto every pod, and the tool would then prune them as its own.
    return dict(kopf.build_owner_reference(kopf.Body(cast(kopf.RawBody, dict(pool_body)))))


def _weights_roots(pool: EnginePoolSpec) -> tuple[str, ...]:
    """Where the worker may load checkpoints in place: the volumes the pool mounts in it."""
    template = (pool.pod.get("podTemplate") or {}).get("spec") or {}
    worker: Mapping[str, Any] = next(
        (c for c in template.get("containers") or [] if c.get("name") == "worker"), {}
    )
    mounts = [*(pool.pod.get("volumeMounts") or []), *(worker.get("volumeMounts") or [])]
    return tuple(sorted({str(m["mountPath"]) for m in mounts if m.get("mountPath")}))


def worker_pod(
    pool: EnginePoolSpec,
    pool_body: Mapping[str, Any],
    name: str,
    tp: int,
    token_digest: str = "",
    policy: PodPolicy | None = None,
) -> dict[str, Any]:
    """One engine instance: the worker image serving the model at ``tp`` GPUs.

    Its token comes from the pool's Secret (:mod:`._tokens`); ``token_digest`` only
    marks which token the pod was made with. With ``policy`` (the operator passes its
    own), the pool's image, volumes and pod template must be within it (ManifestError).
    """
    if policy is not None:
        check_pool_policy(pool, policy)
    resources = dict(pool.pod.get("resources") or {})  # requests == limits (manifest check)
    requests = {**(resources.get("requests") or {}), GPU: str(tp)}
    limits = {**(resources.get("limits") or {}), GPU: str(tp)}
    command = [
        "heddle",
        *WorkerArgs(
            engine="vllm",
            model=pool.model,
            tp=tp,
            host="0.0.0.0",
            port=WORKER_PORT,
            max_model_len=pool.vllm.max_model_len,
            gpu_memory_utilization=pool.vllm.gpu_memory_utilization,
            weights_roots=_weights_roots(pool),
            **WorkerArgs.speculation_flags(pool.speculation),
        ).argv(),
    ]
    probe = {"httpGet": {"path": "/readyz", "port": WORKER_PORT}, "periodSeconds": 5}
    container: dict[str, Any] = {
        "name": "worker",
        "image": pool.image,
        "command": command,
        "args": [f"--vllm-arg={a}" for a in pool.vllm.extra_args],
        "ports": [{"name": "http", "containerPort": WORKER_PORT}],
        "env": [token_env(pool.name)],
        "resources": {**resources, "requests": requests, "limits": limits},
        "readinessProbe": probe,
        "startupProbe": {**probe, "failureThreshold": 120},  # weight loading takes minutes
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": WORKER_PORT},
            "periodSeconds": 10,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    # vLLM's tensor-parallel workers exchange tensors through /dev/shm; a container's
    # default is 64 MiB.
    shm = {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": pool.shm_size_limit}}
    container["volumeMounts"] = [
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        *(pool.pod.get("volumeMounts") or []),
    ]
    spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",  # the operator replaces a failed instance itself
        "terminationGracePeriodSeconds": 60,
        "subdomain": pool.name,
        "hostname": name,
        "automountServiceAccountToken": False,  # workers never call the Kubernetes API
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    for key in ("nodeSelector", "tolerations"):
        if pool.pod.get(key):
            spec[key] = pool.pod[key]
    spec["volumes"] = [shm, *(pool.pod.get("volumes") or [])]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": pool.namespace,
            "labels": {
                LABEL_POOL: pool.name,
                LABEL_TP: str(tp),
                "app.kubernetes.io/name": "heddle-worker",
            },
            "annotations": {ANNOTATION_SPEC_HASH: spec_hash(pool, token_digest)},
            "ownerReferences": [_owner(pool_body)],
        },
        "spec": spec,
    }
    return apply_pod_template(pod, pool.pod.get("podTemplate") or {})


def headless_service(pool: EnginePoolSpec, pool_body: Mapping[str, Any]) -> dict[str, Any]:
    """DNS names for the instances (``<pod>.<pool>.<namespace>.svc``)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": pool.name,
            "namespace": pool.namespace,
            "labels": {LABEL_POOL: pool.name},
            "ownerReferences": [_owner(pool_body)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_POOL: pool.name},
            "ports": [{"name": "http", "port": WORKER_PORT, "targetPort": WORKER_PORT}],
            "publishNotReadyAddresses": False,
        },
    }


def worker_network_policy(pool: EnginePoolSpec, pool_body: Mapping[str, Any]) -> dict[str, Any]:
    """Ingress to the pool's workers only from session pods of their namespace, made in
    every namespace a pool lives in (the chart cannot know them in a cluster-wide install).
    NetworkPolicies add up: the chart's own (metrics scrapers, the operator) still apply."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{pool.name}-workers",
            "namespace": pool.namespace,
            "labels": {LABEL_POOL: pool.name, "app.kubernetes.io/managed-by": "heddle"},
            "ownerReferences": [_owner(pool_body)],
        },
        "spec": {
            "podSelector": {"matchLabels": {LABEL_POOL: pool.name}},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"podSelector": {"matchLabels": {
                    "app.kubernetes.io/name": "heddle-session"}}}],
                "ports": [{"port": WORKER_PORT, "protocol": "TCP"}],
            }],
        },
    }  # fmt: skip


def pod_phase(pod: Mapping[str, Any]) -> InstancePhase:
    """The instance's phase as the pool's status reports it, from its pod."""
    meta, status = pod.get("metadata", {}), pod.get("status") or {}
    draining = (meta.get("annotations") or {}).get(ANNOTATION_DRAINING) == "true"
    if draining or meta.get("deletionTimestamp"):
        return InstancePhase.DRAINING
    phase = status.get("phase", "Pending")  # the pod's phase, Kubernetes' own vocabulary
    if phase in ("Failed", "Succeeded"):
        return InstancePhase.FAILED
    if phase != "Running":
        return InstancePhase.PENDING
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return InstancePhase.READY if ready and status.get("podIP") else InstancePhase.STARTING


def shape_entries(shape: PoolShape) -> list[dict[str, int]]:
    return [{"tp": tp, "replicas": n} for tp, n in shape.counts]


MAX_CONDITION_MESSAGE = 32768  # metav1.Condition's limit: the API server refuses longer


def condition(kind: str, status: bool, reason: str, message: str) -> dict[str, str]:
    """A metav1.Condition-shaped entry; ``reason`` is CamelCase (the CRD's pattern)."""
    if len(message) > MAX_CONDITION_MESSAGE:
        cut = " ... (truncated)"
        message = message[: MAX_CONDITION_MESSAGE - len(cut)] + cut
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_iso(),
    }


def merge_conditions(
    current: Sequence[Mapping[str, Any]],
    updates: Sequence[Mapping[str, Any]],
    *,
    generation: int | None,
) -> list[dict[str, Any]]:
    """Replace conditions by type; keep lastTransitionTime when the status did not change.

    Each updated condition records the ``generation`` of the spec it was computed
    from (``observedGeneration``), as metav1.Condition does.
    """
    merged = {c["type"]: dict(c) for c in current}
    for new in updates:
        old = merged.get(new["type"])
        entry = dict(new)
        if old is not None and old.get("status") == new["status"]:
            entry["lastTransitionTime"] = old.get("lastTransitionTime", new["lastTransitionTime"])
        if generation is not None:
            entry["observedGeneration"] = generation
        merged[new["type"]] = entry
    return list(merged.values())
