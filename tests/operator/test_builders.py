"""Pure builders: spec -> Pod and Service manifests, pod phases, conditions."""

from __future__ import annotations

from typing import Any

import pytest

from heddle.api import ANNOTATION_DRAINING, ANNOTATION_SPEC_HASH, EnginePoolSpec
from heddle.exceptions import ManifestError
from heddle.operator import (
    MAX_CONDITION_MESSAGE,
    condition,
    headless_service,
    merge_conditions,
    pod_phase,
    spec_hash,
    worker_pod,
)

BODY: dict[str, Any] = {
    "apiVersion": "heddle.dev/v1alpha1",
    "kind": "EnginePool",
    "metadata": {"name": "qwen", "namespace": "rl", "uid": "u-1"},
    "spec": {
        "model": "Qwen/Qwen3-14B",
        "gpus": 16,
        "image": "registry/worker:1",
        "vllm": {"maxModelLen": 32768, "extraArgs": ["enable_chunked_prefill=true"]},
        "resources": {"requests": {"memory": "64Gi"}},
        "nodeSelector": {"gpu": "h100"},
    },
}


def test_worker_pod_requests_its_tp_in_gpus() -> None:
    pool = EnginePoolSpec.from_manifest(BODY)
    pod = worker_pod(pool, BODY, "qwen-tp4-0", 4)
    container = pod["spec"]["containers"][0]
    # Guaranteed QoS: the limit follows the request.
    assert container["resources"]["requests"] == {"memory": "64Gi", "nvidia.com/gpu": "4"}
    assert container["resources"]["limits"] == {"memory": "64Gi", "nvidia.com/gpu": "4"}
    assert pod["metadata"]["labels"]["heddle.dev/pool"] == "qwen"
    assert pod["metadata"]["labels"]["heddle.dev/tp"] == "4"
    assert pod["metadata"]["namespace"] == "rl"
    owner = pod["metadata"]["ownerReferences"][0]
    assert owner == {
        "apiVersion": "heddle.dev/v1alpha1", "kind": "EnginePool", "name": "qwen", "uid": "u-1",
        "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip
    assert container["command"][:4] == ["heddle", "worker", "--engine", "vllm"]
    assert "--tp" in container["command"] and "32768" in container["command"]
    assert container["args"] == ["--vllm-arg=enable_chunked_prefill=true"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["nodeSelector"] == {"gpu": "h100"}


def test_spec_hash_ignores_the_shape_but_not_the_image() -> None:
    pool = EnginePoolSpec.from_manifest(BODY)
    reshaped = dict(BODY, spec={**BODY["spec"], "shape": [{"tp": 8, "replicas": 2}]})
    new_image = dict(BODY, spec={**BODY["spec"], "image": "registry/worker:2"})
    assert spec_hash(EnginePoolSpec.from_manifest(reshaped)) == spec_hash(pool)
    assert spec_hash(EnginePoolSpec.from_manifest(new_image)) != spec_hash(pool)


def test_headless_service_selects_the_pool() -> None:
    service = headless_service(EnginePoolSpec.from_manifest(BODY), BODY)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"heddle.dev/pool": "qwen"}


def _pod(phase: str, ready: bool = False, ip: str | None = None, **meta: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    if ip:
        status["podIP"] = ip
    return {"metadata": {"name": "x", **meta}, "status": status}


def test_pod_phase() -> None:
    assert pod_phase(_pod("Pending")) == "Pending"
    assert pod_phase(_pod("Running")) == "Starting"
    assert pod_phase(_pod("Running", ready=True, ip="10.0.0.1")) == "Ready"
    assert pod_phase(_pod("Failed")) == "Failed"
    assert (
        pod_phase(_pod("Running", True, "10.0.0.1", annotations={ANNOTATION_DRAINING: "true"}))
        == "Draining"
    )
    assert pod_phase(_pod("Running", True, "10.0.0.1", deletionTimestamp="t")) == "Draining"


def test_conditions_keep_transition_time_while_status_holds() -> None:
    first = merge_conditions([], [condition("Ready", False, "A", "a")], generation=1)
    first[0]["lastTransitionTime"] = "2026-01-01T00:00:00Z"
    same = merge_conditions(first, [condition("Ready", False, "B", "b")], generation=1)
    assert same[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z" and same[0]["reason"] == "B"
    flipped = merge_conditions(first, [condition("Ready", True, "C", "c")], generation=1)
    assert flipped[0]["lastTransitionTime"] != "2026-01-01T00:00:00Z"


def test_conditions_record_the_generation_they_were_computed_from() -> None:
    first = merge_conditions([], [condition("Ready", True, "A", "a")], generation=3)
    later = merge_conditions(first, [condition("Degraded", False, "B", "b")], generation=4)
    by_type = {c["type"]: c for c in later}
    # Only what was re-evaluated moves to the new generation (metav1.Condition's meaning).
    assert by_type["Ready"]["observedGeneration"] == 3
    assert by_type["Degraded"]["observedGeneration"] == 4


def test_a_condition_message_fits_the_api_servers_limit() -> None:
    c = condition("Failed", True, "Crashed", "x" * (MAX_CONDITION_MESSAGE + 10))
    assert len(c["message"]) == MAX_CONDITION_MESSAGE
    assert c["message"].endswith("(truncated)")


def _pool(**spec: Any) -> tuple[EnginePoolSpec, dict[str, Any]]:
    body = {**BODY, "spec": {**BODY["spec"], **spec}}
    return EnginePoolSpec.from_manifest(body), body


def test_worker_pod_gets_a_memory_backed_dev_shm_of_the_pools_size() -> None:
    pool, body = _pool(shmSizeLimit="32Gi")
    pod = worker_pod(pool, body, "qwen-tp8-0", 8)
    (shm,) = [v for v in pod["spec"]["volumes"] if v["name"] == "heddle-shm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "heddle-shm", "mountPath": "/dev/shm"} in mounts


@pytest.mark.parametrize(
    ("resources", "error"),
    [
        ({"requests": {"cpu": "8"}, "limits": {"cpu": "4"}}, "requests=8 and limits=4 differ"),
        ({"limits": {"nvidia.com/gpu": "8"}}, "comes from each instance's tp"),
        ({"requests": {"memory": "lots"}}, "not a Kubernetes quantity"),
        ({"request": {"cpu": "1"}}, "requests and/or limits"),
    ],
)
def test_resources_that_cannot_be_guaranteed_are_refused(
    resources: dict[str, Any], error: str
) -> None:
    with pytest.raises(ManifestError, match=error):
        _pool(resources=resources)


TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "q"}, "annotations": {"a": "b"}},
    "spec": {
        "priorityClassName": "rl",
        "serviceAccountName": "puller",
        "imagePullSecrets": [{"name": "regcred"}],
        "automountServiceAccountToken": True,
        "securityContext": {"fsGroup": 10001},
        "tolerations": [{"key": "spot", "operator": "Exists"}],
        "volumes": [{"name": "cache", "emptyDir": {}}],
        "containers": [
            {"name": "worker", "env": [{"name": "HF_HOME", "value": "/models"}],
             "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]},
            {"name": "log-shipper", "image": "fluent-bit:3"},
        ],
    },
}  # fmt: skip


def test_pod_template_is_the_base_the_operator_builds_on() -> None:
    pool, body = _pool(podTemplate=TEMPLATE, tolerations=[{"key": "gpu", "operator": "Exists"}])
    pod = worker_pod(pool, body, "qwen-tp2-0", 2)
    spec, meta = pod["spec"], pod["metadata"]
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    assert meta["labels"]["heddle.dev/pool"] == "qwen" and meta["annotations"]["a"] == "b"
    assert ANNOTATION_SPEC_HASH in meta["annotations"]
    assert (spec["priorityClassName"], spec["serviceAccountName"]) == ("rl", "puller")
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["automountServiceAccountToken"] is False  # workers never call the API
    assert spec["securityContext"]["fsGroup"] == 10001 and spec["securityContext"]["runAsNonRoot"]
    assert [t["key"] for t in spec["tolerations"]] == ["spot", "gpu"]  # lists concatenate
    assert {v["name"] for v in spec["volumes"]} == {"cache", "heddle-shm"}
    worker, sidecar = spec["containers"]
    assert worker["name"] == "worker" and worker["image"] == "registry/worker:1"
    assert worker["env"] == [  # the template's env, then the pool's token from its Secret
        {"name": "HF_HOME", "value": "/models"},
        {"name": "HEDDLE_WORKER_TOKEN",
         "valueFrom": {"secretKeyRef": {"name": "qwen-worker-token", "key": "token"}}},
    ]  # fmt: skip
    assert [m["mountPath"] for m in worker["volumeMounts"]] == ["/cache", "/dev/shm"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert sidecar == {"name": "log-shipper", "image": "fluent-bit:3"}


def test_a_template_change_rolls_the_workers() -> None:
    plain, _ = _pool()
    templated, _ = _pool(podTemplate=TEMPLATE)
    assert spec_hash(plain) != spec_hash(templated)


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ({"spec": {"containers": [{"name": "worker", "image": "x"}]}}, r"containers\[0\]\.image"),
        ({"spec": {"containers": [{"name": "worker", "resources": {}}]}}, "use spec.resources"),
        ({"spec": {"restartPolicy": "Always"}}, "spec.restartPolicy is set by the operator"),
        ({"metadata": {"labels": {"heddle.dev/pool": "x"}}}, "belong to the operator"),
        ({"metadata": {"name": "x"}}, "labels and annotations only"),
        ({"spec": {"containers": [{"image": "x"}]}}, "needs a name"),
        ({"kind": "Pod"}, "must be a pod template"),
        (
            {
                "spec": {
                    "containers": [
                        {"name": "worker", "env": [{"name": "HEDDLE_WORKER_TOKEN", "value": "x"}]}
                    ]
                }
            },
            "HEDDLE_WORKER_TOKEN of the worker container is set by the operator",
        ),
    ],
)
def test_a_template_that_sets_what_the_operator_owns_is_refused(
    template: dict[str, Any], error: str
) -> None:
    with pytest.raises(ManifestError, match=error):
        _pool(podTemplate=template)


def test_workers_read_the_pools_token_and_a_new_token_rolls_them() -> None:
    pool, body = _pool()
    pod = worker_pod(pool, body, "qwen-tp1-0", 1, token_digest="aaa")
    assert pod["spec"]["containers"][0]["env"] == [
        {"name": "HEDDLE_WORKER_TOKEN",
         "valueFrom": {"secretKeyRef": {"name": "qwen-worker-token", "key": "token"}}},
    ]  # fmt: skip
    assert pod["metadata"]["annotations"][ANNOTATION_SPEC_HASH] == spec_hash(pool, "aaa")
    assert spec_hash(pool, "aaa") != spec_hash(pool, "bbb")  # a new token replaces instances
