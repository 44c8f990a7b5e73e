"""The session pod and its RBAC, as the operator builds them (pure functions)."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from heddle.api import RolloutJobSpec
from heddle.cli._session import session_config_from_env
from heddle.exceptions import ConfigError, ManifestError
from heddle.operator._session_builders import (
    LABEL_JOB,
    SESSION_ACCOUNT,
    SessionPodOptions,
    gateway_objects,
    gateway_url,
    session_pod,
    session_rbac,
    trainer_objects,
    trainer_url,
)
from heddle.rollout import HostAllowList, SessionConfig
from heddle.scheduler.sim import DECISION_WORKERS

from ._cluster import resource_field_value

JOB: dict[str, Any] = {
    "apiVersion": "heddle.dev/v1alpha1",
    "kind": "RolloutJob",
    "metadata": {"name": "j", "namespace": "rl", "uid": "5f0c7a52-1d6e-4a3b-9c4e-0b1f2a3c4d5e"},
    "spec": {
        "enginePool": "p",
        "environment": {"type": "synthetic", "synthetic": {"workload": "quickstart"}},
        "output": {"path": "out.jsonl"},
    },
}


def _pod(block: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    body = copy.deepcopy(JOB)
    if block is not None:
        body["spec"]["session"] = block
    job = RolloutJobSpec.from_manifest(body)
    # Metrics off unless a test asks: the ports a job's own features add then stand alone.
    return session_pod(job, body, SessionPodOptions(**{"metrics_port": 0, **options}))


def test_the_session_pod_runs_heddle_session_for_its_job_owned_by_it() -> None:
    pod = _pod(image="registry/heddle:1", base_dir=Path("/work"), status_interval_s=0.5)
    meta = pod["metadata"]
    assert meta["generateName"] == "j-session-" and meta["namespace"] == "rl"
    assert meta["labels"][LABEL_JOB] == "j"
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "RolloutJob",
        "j",
        JOB["metadata"]["uid"],
    )
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["serviceAccountName"] == "j-session"
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["image"] == "registry/heddle:1"
    assert container["command"] == [
        "heddle", "session", "--namespace", "rl", "--job", "j", "--base-dir", "/work",
        "--status-interval", "0.5", "--metrics-port", "0",
    ]  # fmt: skip
    env = {e["name"]: e for e in container["env"]}
    assert env["HEDDLE_WORKER_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "p-worker-token", "key": "token",
    }  # fmt: skip
    # Always passed on: an empty list denies every tool host in the session as well.
    assert env["HEDDLE_TOOL_ALLOWED_HOSTS"] == {"name": "HEDDLE_TOOL_ALLOWED_HOSTS", "value": ""}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["limits"]["memory"] == "4Gi"  # a default when none is given
    # A CPU for each process the start-up decisions simulate on, and the request passed
    # in so that the session starts no more of them.
    assert container["resources"]["requests"]["cpu"] == str(DECISION_WORKERS)
    cpus = env["HEDDLE_CPUS"]["valueFrom"]["resourceFieldRef"]
    assert resource_field_value(pod, cpus) == str(DECISION_WORKERS)


def test_the_jobs_session_block_reaches_the_pod() -> None:
    session = {
        "image": "mine/heddle:2",
        "serviceAccountName": "trainer",
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "rl"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "8Gi"}},
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "rl", "operator": "Exists"}],
    }
    pod = _pod(session, image="operator/heddle:1")
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["image"] == "mine/heddle:2"
    assert spec["serviceAccountName"] == "trainer"
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "rl"}} in spec["volumes"]
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    assert container["resources"] == session["resources"]
    # The decisions' worker processes follow the pod's own CPU request (2 here), which
    # the kubelet passes in through the downward API.
    env = {e["name"]: e for e in container["env"]}
    assert env["HEDDLE_CPUS"]["valueFrom"] == {"resourceFieldRef": {
        "containerName": "session", "resource": "requests.cpu", "divisor": "1"}}  # fmt: skip
    ref = env["HEDDLE_CPUS"]["valueFrom"]["resourceFieldRef"]
    assert resource_field_value(pod, ref) == "2"
    container["resources"] = {"requests": {"cpu": "500m"}}  # rounded up, as a kubelet does
    assert resource_field_value(pod, ref) == "1"
    assert spec["nodeSelector"] == {"pool": "cpu"}
    assert spec["tolerations"] == [{"key": "rl", "operator": "Exists"}]


def test_the_operators_session_knobs_and_allow_list_are_passed_on() -> None:
    config = SessionConfig(replan_interval_s=0.5, unhealthy_after=2)
    hosts = HostAllowList.parse("sandbox.rl.svc,*.tools.svc,10.0.0.0/8")
    pod = _pod(session=config, tool_hosts=hosts)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert session_config_from_env(env["HEDDLE_SESSION_CONFIG"]) == config
    assert HostAllowList.parse(env["HEDDLE_TOOL_ALLOWED_HOSTS"]) == hosts


def test_a_bad_session_config_is_one_sentence() -> None:
    with pytest.raises(ConfigError, match=r"must be a JSON object of .*got \['speed'\]"):
        session_config_from_env(json.dumps({"speed": 1}))
    with pytest.raises(ConfigError, match="is not JSON"):
        session_config_from_env("{")


def test_the_session_role_grants_what_a_session_does_and_no_secrets() -> None:
    job = RolloutJobSpec.from_manifest(JOB)
    objects = dict(session_rbac(job, JOB))
    meta = objects["serviceaccounts"]["metadata"]
    assert (meta["name"], meta["namespace"]) == ("j-session", "rl")
    assert meta["labels"] == {"app.kubernetes.io/name": SESSION_ACCOUNT,
                              "app.kubernetes.io/managed-by": "heddle", LABEL_JOB: "j"}  # fmt: skip
    assert meta["ownerReferences"][0]["uid"] == JOB["metadata"]["uid"]  # goes with the job
    rules = objects["roles"]["rules"]
    granted = {
        (g, r, v, tuple(rule.get("resourceNames", ())))
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    pool = job.engine_pool
    # Every rule but Events names its objects: one job's session cannot patch another's status.
    assert granted == {
        ("heddle.dev", "rolloutjobs", "get", ("j",)),
        ("heddle.dev", "rolloutjobs/status", "get", ("j",)),
        ("heddle.dev", "rolloutjobs/status", "patch", ("j",)),
        ("heddle.dev", "enginepools", "get", (pool,)),
        ("", "events", "create", ()),
    }  # fmt: skip
    binding = objects["rolebindings"]
    assert binding["roleRef"]["name"] == "j-session"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "j-session", "namespace": "rl"}
    ]


def test_an_external_job_gets_its_gateways_secret_service_and_port() -> None:
    body = copy.deepcopy(JOB)
    body["spec"]["environment"] = {"type": "external"}
    body["spec"]["tasks"] = {"inline": [{"prompt": "x"}]}
    job = RolloutJobSpec.from_manifest(body)
    pod = session_pod(job, body, SessionPodOptions(metrics_port=0))
    (container,) = pod["spec"]["containers"]
    assert container["command"][-4:] == ["--gateway-host", "0.0.0.0", "--gateway-port", "8080"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HEDDLE_GATEWAY_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "j-gateway-token", "key": "token",
    }  # fmt: skip
    assert {"name": "gateway", "containerPort": 8080} in container["ports"]
    objects = dict(gateway_objects(job, body, "s3cret"))
    secret, service = objects["secrets"], objects["services"]
    assert secret["metadata"]["name"] == "j-gateway-token"
    assert secret["metadata"]["ownerReferences"][0]["name"] == "j"
    assert service["metadata"]["name"] == "j-gateway"
    assert service["spec"]["selector"] == {LABEL_JOB: "j"}
    assert gateway_url(job) == "http://j-gateway.rl.svc:8080/v1"
    # Not external: no gateway arguments, token or port.
    plain = _pod()["spec"]["containers"][0]
    assert "--gateway-port" not in plain["command"] and "ports" not in plain


def test_a_trainer_api_job_gets_its_token_secret_clusterip_service_and_port() -> None:
    body = copy.deepcopy(JOB)
    body["spec"]["asynchrony"] = {"groupsPerIteration": 2, "trainerApi": True}
    job = RolloutJobSpec.from_manifest(body)
    (container,) = session_pod(job, body, SessionPodOptions(metrics_port=0))["spec"]["containers"]
    assert container["command"][-4:] == ["--gateway-host", "0.0.0.0", "--trainer-port", "8081"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HEDDLE_TRAINER_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "j-trainer-token", "key": "token",
    }  # fmt: skip
    assert {"name": "trainer", "containerPort": 8081} in container["ports"]
    objects = dict(trainer_objects(job, body, "s3cret"))
    secret, service = objects["secrets"], objects["services"]
    assert secret["metadata"]["name"] == "j-trainer-token"
    assert base64.b64decode(secret["data"]["token"]) == b"s3cret"
    assert service["metadata"]["name"] == "j-trainer"
    for obj in (secret, service):  # the job's namespace, owned by the job: they go with it
        assert obj["metadata"]["namespace"] == "rl"
        assert obj["metadata"]["ownerReferences"][0]["uid"] == JOB["metadata"]["uid"]
    assert service["spec"]["type"] == "ClusterIP"  # never reachable from outside the cluster
    assert service["spec"]["selector"] == {
        LABEL_JOB: "j",
        "app.kubernetes.io/name": SESSION_ACCOUNT,
    }
    assert service["spec"]["ports"] == [{"name": "trainer", "port": 8081, "targetPort": 8081}]
    assert trainer_url("j", "rl") == "http://j-trainer.rl.svc:8081"
    # Without trainerApi (a quota alone): no trainer port, token or flag.
    body["spec"]["asynchrony"] = {"groupsPerIteration": 2}
    plain = session_pod(RolloutJobSpec.from_manifest(body), body, SessionPodOptions(metrics_port=0))
    (container,) = plain["spec"]["containers"]
    assert "--trainer-port" not in container["command"] and "ports" not in container
    assert "HEDDLE_TRAINER_TOKEN" not in {e["name"] for e in container["env"]}


def test_trainer_api_must_be_a_boolean() -> None:
    body = copy.deepcopy(JOB)
    body["spec"]["asynchrony"] = {"trainerApi": "yes"}
    with pytest.raises(ManifestError, match="must be true or false"):
        RolloutJobSpec.from_manifest(body)
