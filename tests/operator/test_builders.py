"""Pure builders: spec -> Pod and Service manifests, pod phases, conditions."""

from __future__ import annotations

from typing import Any

from heddle.operator._builders import (
    DRAINING,
    MAX_CONDITION_MESSAGE,
    condition,
    headless_service,
    merge_conditions,
    pod_phase,
    spec_hash,
    worker_pod,
)
from heddle.operator._manifests import EnginePoolSpec

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
    assert container["resources"]["requests"] == {"memory": "64Gi", "nvidia.com/gpu": "4"}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert pod["metadata"]["labels"]["heddle.dev/pool"] == "qwen"
    assert pod["metadata"]["labels"]["heddle.dev/tp"] == "4"
    assert pod["metadata"]["namespace"] == "rl"
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("EnginePool", "u-1", True)
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
        pod_phase(_pod("Running", True, "10.0.0.1", annotations={DRAINING: "true"})) == "Draining"
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
