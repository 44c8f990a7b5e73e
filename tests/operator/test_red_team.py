"""Issue 24 ("Tenant safety"), replayed: each finding as a tenant's attempt, and its refusal.

Through kopf against the API server over HTTP, as the other operator tests: a
tenant may create RolloutJobs and EnginePools in its namespace, nothing more,
and must not get from the operator what it could not do itself (docs/security.md).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from heddle.api import LABEL_JOB, PodPolicy
from heddle.operator import run_operator

from ._cluster import ADMIN_HEADER
from ._operator_fixture import FAST, Cluster, cluster, job, path, pool, wait_for
from .test_operator import _finished

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # slow: real processes, see pyproject

INLINE = {"inline": [{"prompt": "x"}]}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions", []):
        if c["type"] == kind:
            return c
    return None


async def _failed(c: Cluster, name: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        body = await c.get("rolloutjobs", name)
        return body if (body or {}).get("status", {}).get("phase") == "Failed" else None

    return await wait_for(probe, 60, f"job {name} to fail")


async def _degraded(c: Cluster, name: str, reason: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        cond = _condition(await c.get("enginepools", name), "Degraded")
        return cond if cond and cond["reason"] == reason else None

    return await wait_for(probe, 60, f"pool {name} Degraded/{reason}")


async def _start(c: Cluster, **config: Any) -> None:
    c.stop = asyncio.Event()
    settings = dataclasses.replace(FAST, api_server=c.url, data_root=c.tmp, **config)
    c.operator = asyncio.create_task(run_operator(settings, stop_flag=c.stop))


async def test_session_fields_beyond_a_tenants_own_fail_the_job_with_the_setting_named(
    tmp_path: Path,
) -> None:
    """Finding 1: spec.session chose the image, any ServiceAccount and any volume."""
    attempts = {
        "hostpath": ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
                     "spec.session.volumes[0].hostPath: a hostPath volume (the node's files) is "
                     "refused by default; an admin allows it with --pod-allow=hostPath"),
        "secret": ({"volumes": [{"name": "s", "secret": {"secretName": "db-password"}}]},
                   "spec.session.volumes[0].secret: a Secret volume is refused by default"),
        "token": ({"volumes": [{"name": "t", "projected": {"sources": [
                      {"serviceAccountToken": {"path": "token"}}]}}]},
                  "spec.session.volumes[0].projected.sources[0].serviceAccountToken"),
        "account": ({"serviceAccountName": "cluster-admin-sa"},
                    "spec.session.serviceAccountName='cluster-admin-sa': pods the operator makes "
                    "run only as the namespace's default ServiceAccount"),
        "image": ({"image": "docker.io/attacker/shell:1"},
                  "spec.session.image='docker.io/attacker/shell:1' is not among the images this "
                  "operator runs (ghcr.io/heddle-dev/"),
    }  # fmt: skip
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 1, [{"tp": 1, "replicas": 1}]))
        for name, (session, _) in attempts.items():
            reply = await c.apply(job(name, "p", tmp_path / f"{name}.jsonl", session=session))
            assert reply.status_code in (200, 201), reply.text
        for name, (_, sentence) in attempts.items():
            valid = _condition(await _failed(c, name), "Valid")
            assert valid is not None and valid["reason"] == "InvalidSpec"
            assert sentence in valid["message"], valid["message"]
            assert "chart" in valid["message"]  # the chart value that allows it, too
        pods = [p["metadata"]["name"] for p in await c.list("pods")]
        assert not [p for p in pods if "session" in p], pods  # no pod was ever made


async def test_pod_template_host_fields_are_refused_by_the_crd_and_the_operator(
    tmp_path: Path,
) -> None:
    """Finding 2: only restartPolicy, hostname and subdomain were refused in podTemplate."""
    never = {
        "hostpid": {"hostPID": True},
        "privileged": {"containers": [{"name": "side", "image": "ghcr.io/heddle-dev/x:1",
                                       "securityContext": {"privileged": True}}]},
        "escalate": {"initContainers": [{"name": "init", "image": "ghcr.io/heddle-dev/x:1",
                                         "securityContext": {"allowPrivilegeEscalation": True}}]},
    }  # fmt: skip
    opt_in = {
        "hostnet": ({"hostNetwork": True}, "podTemplate.spec.hostNetwork: the host's network"),
        "hostpath": ({"volumes": [{"name": "r", "hostPath": {"path": "/"}}]},
                     "podTemplate.spec.volumes[0].hostPath"),
        "account": ({"serviceAccountName": "kube-proxy"},
                    "podTemplate.spec.serviceAccountName='kube-proxy'"),
        "caps": ({"containers": [{"name": "worker", "securityContext": {
                     "capabilities": {"add": ["SYS_ADMIN"]}}}]},
                 "podTemplate.spec.containers[0].securityContext.capabilities.add"),
        "sidecar": ({"containers": [{"name": "side", "image": "docker.io/miner:1"}]},
                    "podTemplate.spec.containers[0].image='docker.io/miner:1'"),
        "hostport": ({"containers": [{"name": "side", "image": "ghcr.io/heddle-dev/x:1",
                                      "ports": [{"containerPort": 22, "hostPort": 22}]}]},
                     "ports[0].hostPort: a host port"),
    }  # fmt: skip
    async with cluster(tmp_path) as c:
        for name, spec in never.items():
            reply = await c.apply(pool(name, 1, podTemplate={"spec": spec}))
            assert reply.status_code == 422, (name, reply.text)
            assert "never allowed in Heddle's pods" in reply.text
        for name, (spec, _) in opt_in.items():
            reply = await c.apply(pool(name, 1, podTemplate={"spec": spec}))
            assert reply.status_code in (200, 201), reply.text
        for name, (_, sentence) in opt_in.items():
            cond = await _degraded(c, name, "InvalidSpec")
            assert sentence in cond["message"], cond["message"]
            assert "operator.podPolicy" in cond["message"]
        # And the pool's own fields: a hostPath volume and another image.
        await c.apply(pool("own", 1, volumes=[{"name": "r", "hostPath": {"path": "/etc"}}]))
        assert "spec.volumes[0].hostPath" in (await _degraded(c, "own", "InvalidSpec"))["message"]
        await asyncio.sleep(1.0)  # several reconcile rounds
        assert await c.list("pods") == []


async def test_an_admins_opt_in_admits_what_it_names_and_nothing_else(tmp_path: Path) -> None:
    policy = PodPolicy(allow=frozenset({"hostPath"}))
    async with cluster(tmp_path, operator=False) as c:
        await _start(c, pod_policy=policy)
        volumes = [{"name": "models", "hostPath": {"path": "/mnt/models"}}]
        await c.apply(pool("p", 1, [{"tp": 1, "replicas": 1}], volumes=volumes))
        await c.apply(pool("q", 1, podTemplate={"spec": {"hostNetwork": True}}))

        async def made() -> list[dict[str, Any]]:
            return [p for p in await c.list("pods") if p["metadata"]["name"].startswith("p-")]

        (pod,) = await wait_for(made, 60, "the hostPath pool's pod")
        assert {"name": "models", "hostPath": {"path": "/mnt/models"}} in pod["spec"]["volumes"]
        assert "--pod-allow=hostNetwork" in (await _degraded(c, "q", "InvalidSpec"))["message"]


async def test_a_foreign_pod_with_the_pools_label_is_never_an_instance(tmp_path: Path) -> None:
    """Finding 4: a pod labelled heddle.dev/pool=p1 became an instance, got prompts and the
    token, and the planner drained a real worker instead."""
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 1}]))

        async def ready() -> dict[str, Any] | None:
            obj = await c.get("enginepools", "p")
            cond = _condition(obj, "Ready")
            return obj if cond and cond["status"] == "True" else None

        await wait_for(ready, 60, "pool Ready")
        (real,) = await c.list("pods")
        foreign = copy.deepcopy(real)
        foreign["metadata"] = {"name": "p-tp1-1", "labels": real["metadata"]["labels"],
                               "annotations": real["metadata"]["annotations"]}  # fmt: skip
        foreign.pop("status", None)
        reply = await c.http.post(path("pods"), json=foreign, headers={ADMIN_HEADER: "1"})
        assert reply.status_code in (200, 201), reply.text

        async def running() -> dict[str, Any] | None:
            pod = await c.get("pods", "p-tp1-1")
            return pod if (pod or {}).get("status", {}).get("podIP") else None

        await wait_for(running, 60, "the foreign pod to run")

        async def reported() -> list[str]:
            return [e["message"] for e in await c.list("events")
                    if e.get("reason") == "ForeignPodIgnored"]  # fmt: skip

        (event,) = await wait_for(reported, 30, "the ForeignPodIgnored event")
        assert "p-tp1-1" in event
        await asyncio.sleep(2.0)  # rounds that would have counted, drained or routed to it
        status = (await c.get("enginepools", "p"))["status"]
        assert [i["name"] for i in status["instances"]] == [real["metadata"]["name"]]
        kept = await c.get("pods", "p-tp1-1")
        assert kept is not None and not kept["metadata"].get("deletionTimestamp")
        assert "heddle.dev/draining" not in (kept["metadata"].get("annotations") or {})


async def test_objects_under_a_jobs_or_pools_names_are_used_only_if_owned(
    tmp_path: Path,
) -> None:
    """Finding 6: a pre-existing <job>-gateway Service or token Secret was reused as it was."""
    async with cluster(tmp_path) as c:
        planted = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "ext-gateway"},
            "spec": {"selector": {"app": "attacker"}, "ports": [{"port": 8080}]},
        }
        await c.http.post(path("services"), json=planted)
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "p-worker-token"},
                  "data": {"token": "a25vd24tdG8tdGhlLWF0dGFja2Vy"}}  # fmt: skip
        await c.apply(secret)
        await c.apply(pool("p", 1, [{"tp": 1, "replicas": 1}]))
        external = {"type": "external"}
        await c.apply(job("ext", "p", tmp_path / "e.jsonl", environment=external, tasks=INLINE))
        valid = _condition(await _failed(c, "ext"), "Valid")
        assert valid is not None and valid["reason"] == "NameTaken"
        assert valid["message"] == (
            "a Service named 'ext-gateway' already exists in namespace default and is not this "
            "job's (no owner reference to it); the operator does not reuse objects it did not "
            "make: delete that Service or rename the job"
        )
        cond = await _degraded(c, "p", "WorkerTokenMissing")
        assert "Secret p-worker-token exists but the pool does not own it" in cond["message"]
        await asyncio.sleep(1.0)
        assert [p for p in await c.list("pods") if p["metadata"]["name"].startswith("p-")] == []


async def test_defaults_deny_tool_egress_and_make_least_privilege_objects(tmp_path: Path) -> None:
    """Finding 3 (egress open by default, no worker NetworkPolicy cluster-wide) and finding
    6 (the session Role could patch every job's status)."""
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 1, [{"tp": 1, "replicas": 1}]))
        tools = {"endpoints": [{"name": "meta", "url": "http://169.254.169.254/latest"}]}
        environment = {"type": "tools", "tools": tools}
        await c.apply(job("open", "p", tmp_path / "o.jsonl", environment=environment,
                          tasks=INLINE))  # fmt: skip
        valid = _condition(await _failed(c, "open"), "Valid")
        assert valid is not None and "lets tools reach no host" in valid["message"]
        assert "or sets it to '*' to allow any host" in valid["message"]

        async def policy() -> dict[str, Any] | None:
            reply = await c.http.get(
                "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/p-workers"
            )
            return reply.json() if reply.status_code == 200 else None

        netpol = await wait_for(policy, 60, "the pool's worker NetworkPolicy")
        assert netpol["spec"]["podSelector"] == {"matchLabels": {"heddle.dev/pool": "p"}}
        (rule,) = netpol["spec"]["ingress"]
        assert rule["from"] == [
            {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "heddle-session"}}}
        ]
        pool_uid = (await c.get("enginepools", "p"))["metadata"]["uid"]
        assert netpol["metadata"]["ownerReferences"][0]["uid"] == pool_uid

        await c.apply(job("j", "p", tmp_path / "j.jsonl"))

        async def role() -> dict[str, Any] | None:
            reply = await c.http.get(
                "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles/j-session"
            )
            return reply.json() if reply.status_code == 200 else None

        granted = await wait_for(role, 60, "the job's session Role")
        status_rules = [r for r in granted["rules"] if "rolloutjobs/status" in r["resources"]]
        assert status_rules == [{"apiGroups": ["heddle.dev"], "resources": ["rolloutjobs/status"],
                                 "verbs": ["get", "patch"], "resourceNames": ["j"]}]  # fmt: skip
        assert all(r.get("resourceNames") for r in granted["rules"] if r["resources"] != ["events"])


async def test_a_finished_jobs_status_does_not_steer_the_pool(tmp_path: Path) -> None:
    """Finding 6: the operator trusted plannedShape, drained and weightVersions from any job's
    status, finished ones included."""
    async with cluster(tmp_path) as c:
        # The job first, while its pool does not exist: no session ever runs for it.
        await c.apply(job("old", "p", tmp_path / "old.jsonl"))

        async def pending() -> dict[str, Any] | None:
            body = await c.get("rolloutjobs", "old")
            return body if (body or {}).get("status", {}).get("phase") == "Pending" else None

        await wait_for(pending, 60, "the job waiting for its pool")
        forged = {"status": {"phase": "Succeeded", "plannedShape": [{"tp": 2, "replicas": 1}],
                             "drained": ["p-tp1-0", "p-tp1-1"],
                             "weightVersions": {"p-tp1-0": "forged"}}}  # fmt: skip
        reply = await c.http.patch(
            path("rolloutjobs", "old", "status"), json=forged,
            headers={"Content-Type": "application/merge-patch+json"},
        )  # fmt: skip
        assert reply.status_code == 200, reply.text
        await c.apply(pool("p", 2))  # shape auto: baseline 2xTP1 until a running job plans

        async def baseline() -> dict[str, Any] | None:
            obj = await c.get("enginepools", "p")
            shape = ((obj or {}).get("status") or {}).get("shape") or {}
            return obj if shape.get("readySummary") == "2/2" else None

        await wait_for(baseline, 60, "the baseline shape")
        await asyncio.sleep(3.0)  # ten reconcile rounds
        status = (await c.get("enginepools", "p"))["status"]
        assert status["shape"]["source"] == "baseline" and status["shape"]["summary"] == "2xTP1"
        assert all("weightVersion" not in i for i in status["instances"])
        assert sorted(p["metadata"]["name"] for p in await c.list("pods")) == [
            "p-tp1-0", "p-tp1-1"
        ]  # fmt: skip
        assert (await c.get("rolloutjobs", "old"))["status"]["phase"] == "Succeeded"


async def test_a_forged_kept_decision_is_set_aside_and_the_job_decides_afresh(
    tmp_path: Path,
) -> None:
    """The decisions a pool keeps for its next job (status.decisions) are read back as
    untrusted: one written there beyond the pool's budget, under the very key the next
    job computes, must not reach its session's plan."""
    async with cluster(tmp_path) as c:
        # The key: a job run once on a pool of the same spec (the key names no pool).
        await c.apply(pool("q", 2, tensorParallelSizes=[1, 2]))
        await c.apply(job("probe", "q", tmp_path / "probe.jsonl"))
        done = await _finished(c, "probe")
        assert done["status"]["phase"] == "Succeeded", done["status"]
        key = done["status"]["decisions"]["key"]
        # Its session kept them on the job's volume too, where the next job would take them
        # as they are (the same inputs): gone, so that only the pool's record is offered.
        (c.tmp / ".heddle" / "decisions" / f"{key}.json").unlink()
        # A pool no job has run on: the operator keeps no record of its own there.
        await c.apply(pool("p", 2, tensorParallelSizes=[1, 2]))
        forged = {**done["status"]["decisions"], "shape": [{"tp": 2, "replicas": 4}]}
        reply = await c.http.patch(
            path("enginepools", "p", "status"), json={"status": {"decisions": [forged]}},
            headers={"Content-Type": "application/merge-patch+json"},
        )  # fmt: skip
        assert reply.status_code == 200, reply.text
        await c.apply(job("next", "p", tmp_path / "next.jsonl"))
        done = await _finished(c, "next")
        assert done["status"]["phase"] == "Succeeded", done["status"]
        decided = done["status"]["decisions"]
        assert decided["key"] == key and decided["reused"] is False
        assert sum(e["tp"] * e["replicas"] for e in decided["shape"]) <= 2
        # Its session saw the forged record and said why it set it aside.
        said = "".join(
            (c.kubelet.log_dir / f"{p['metadata']['name']}.log").read_text()
            for p in await c.list("pods")
            if (p["metadata"].get("labels") or {}).get(LABEL_JOB) == "next"
        )
        assert "EnginePool p status.decisions: shape 4xTP2 needs 8 GPUs" in said, said
        assert "deciding afresh" in said

        # The fresh record replaces the forged one under that key (the operator copies
        # it from the job's status on its next round).
        async def replaced() -> list[dict[str, Any]] | None:
            kept = (await c.get("enginepools", "p"))["status"]["decisions"]
            return kept if kept[0]["shape"] == decided["shape"] else None

        assert len(await wait_for(replaced, 30, "the forged record replaced")) == 1
        # Written over again once the operator keeps a record of its own: it restores it.
        reply = await c.http.patch(
            path("enginepools", "p", "status"), json={"status": {"decisions": [forged]}},
            headers={"Content-Type": "application/merge-patch+json"},
        )  # fmt: skip
        assert reply.status_code == 200, reply.text
        assert len(await wait_for(replaced, 30, "the operator's record restored")) == 1


async def test_the_crd_refuses_credentials_in_args_and_unbounded_retries(tmp_path: Path) -> None:
    """Finding 6: extraArgs like hf_token= landed in pod args; retries were unbounded."""
    async with cluster(tmp_path) as c:
        leaky = pool("leak", 1, vllm={"extraArgs": ["hf_token=hf_abcdef"]})
        reply = await c.apply(leaky)
        assert reply.status_code == 422 and "looks like a secret" in reply.text
        tools = {"endpoints": [{"name": "t", "url": "http://127.0.0.1:9/", "retries": 100000}]}
        environment = {"type": "tools", "tools": tools}
        reply = await c.apply(job("r", "p", tmp_path / "r.jsonl", environment=environment,
                                  tasks=INLINE))  # fmt: skip
        assert reply.status_code == 422 and "retries" in reply.text
