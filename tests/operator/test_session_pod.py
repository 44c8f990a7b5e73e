"""Each RolloutJob's session in its own pod: the operator only reconciles around it.

The test kubelet runs a session pod as a real ``heddle session`` process with a
kubeconfig for the test API server, so the session reads its job and pool and
writes status over HTTP, as it would in a cluster.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.api import LABEL_JOB
from heddle.client import ClusterAccess, TrainerClient

from .._rollout_fixtures import assert_exactly_once, read_records
from ._operator_fixture import Cluster, cluster, job, pool, wait_for
from .test_operator import KEYS, SLOW_TOOLS, _condition, _finished, _records_at_least

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # slow: real processes, see pyproject

SLOWER_TOOLS = {"type": "synthetic", "synthetic": {"workload": "quickstart", "toolTimeScale": 5.0}}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _session_pods(c: Cluster, name: str) -> list[dict[str, Any]]:
    return [
        p for p in await c.list("pods")
        if (p["metadata"].get("labels") or {}).get(LABEL_JOB) == name
    ]  # fmt: skip


async def test_the_session_runs_in_a_pod_of_its_own_with_least_privilege(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        await c.apply(job("j", "p", out))
        obj = await _finished(c, "j")
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
        assert_exactly_once(read_records(out), KEYS)
        (pod,) = await _session_pods(c, "j")
        assert pod["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "RolloutJob"
        spec = pod["spec"]
        assert spec["serviceAccountName"] == "j-session"  # the job's own account
        assert spec["restartPolicy"] == "Never"
        (container,) = spec["containers"]
        assert container["command"][:6] == ["heddle", "session", "--namespace", "default",
                                            "--job", "j"]  # fmt: skip
        token = {e["name"]: e for e in container["env"]}["HEDDLE_WORKER_TOKEN"]
        assert token["valueFrom"]["secretKeyRef"] == {"name": "p-worker-token", "key": "token"}
        assert _condition(obj, "SessionReady")["status"] == "True"
        # The account's Role: read its job and pool, patch its job's status; no Secrets.
        role = await c.http.get("/apis/rbac.authorization.k8s.io/v1/namespaces/default/"
                                "roles/j-session")  # fmt: skip
        rules = role.json()["rules"]
        assert not any("secrets" in r["resources"] for r in rules), rules
        assert {"apiGroups": ["heddle.dev"], "resources": ["rolloutjobs/status"],
                "verbs": ["get", "patch"], "resourceNames": ["j"]} in rules  # fmt: skip
        assert all("*" not in r["verbs"] and "delete" not in r["verbs"] for r in rules)
        binding = await c.http.get("/apis/rbac.authorization.k8s.io/v1/namespaces/default/"
                                   "rolebindings/j-session")  # fmt: skip
        assert binding.json()["subjects"] == [
            {"kind": "ServiceAccount", "name": "j-session", "namespace": "default"}
        ]
        account = await c.http.get("/api/v1/namespaces/default/serviceaccounts/j-session")
        assert account.status_code == 200


async def test_the_jobs_replan_interval_reaches_the_session_pod(tmp_path: Path) -> None:
    """spec.scheduling.replanIntervalSeconds works on a cluster: the operator passes its own
    SessionConfig (re-plan every 0.5 s here, _operator_fixture), and the job's 0.05 s wins.

    The session publishes its re-plans in the job's status; at 0.5 s it could do at most
    2 per second (plus one per worker that joins), so far more proves the job's value ran.
    """
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        await c.apply(job("j", "p", out, scheduling={"replanIntervalSeconds": 0.05}))
        obj = await _finished(c, "j")
        status = obj["status"]
        assert status["phase"] == "Succeeded", status
        at_most_operators = 2 * status["elapsedSeconds"] + 2 + 1
        assert status["replans"] > 2 * at_most_operators, status


async def test_the_job_goes_on_while_the_operator_is_stopped(tmp_path: Path) -> None:
    """The operator stops for 10 s mid-job; records keep arriving and the job's status keeps
    moving meanwhile, then the job ends with every trajectory once.

    10 s rather than 30: the session pod never talks to the operator, so a longer pause
    proves nothing more; 10 s spans 20 of the session's status rounds (0.5 s) and lets
    several trajectories finish (each takes ~2-4 s here), which is what is asserted.
    """
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        await c.apply(job("j", "p", out, environment=SLOWER_TOOLS))
        await _records_at_least(out, 2)
        (first,) = await _session_pods(c, "j")
        took = time.monotonic()
        await c.stop_operator()
        took = time.monotonic() - took
        before = len(read_records(out))
        done_before = int((await c.get("rolloutjobs", "j"))["status"].get("done", 0))
        assert before < 48, (before, f"the operator took {took:.1f} s to stop")
        await asyncio.sleep(10)
        during = len(read_records(out))
        done_during = int((await c.get("rolloutjobs", "j"))["status"].get("done", 0))
        assert during > before, "no record arrived while the operator was stopped"
        assert done_during > done_before, "the job's status stood still without the operator"
        await c.start_operator()
        obj = await _finished(c, "j")
        assert obj["status"]["phase"] == "Succeeded"
        assert obj["status"]["done"] == 64
        assert_exactly_once(read_records(out), KEYS)  # nothing re-run, nothing lost
        # The restarted operator found the running session pod and made no other.
        assert [p["metadata"]["name"] for p in await _session_pods(c, "j")] == [
            first["metadata"]["name"]
        ]


async def test_a_killed_session_pod_is_replaced_and_resumes_from_the_output(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        await c.apply(job("j", "p", out, environment=SLOW_TOOLS))
        await _records_at_least(out, 6)
        killed = c.kubelet.kill_session("j")  # SIGKILL: no chance to close anything
        before = len(read_records(out))
        assert before < 64

        async def replaced() -> str | None:
            names = [p["metadata"]["name"] for p in await _session_pods(c, "j")]
            return next((n for n in names if n != killed), None)

        await wait_for(replaced, 60, "a replacement session pod")
        obj = await _finished(c, "j")
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
        assert obj["status"]["done"] == 64
        assert_exactly_once(read_records(out), KEYS)
        assert killed not in [p["metadata"]["name"] for p in await _session_pods(c, "j")]


async def test_deleting_the_job_deletes_its_session_pod(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        await c.apply(job("j", "p", out, environment=SLOW_TOOLS))
        await _records_at_least(out, 2)
        (pod,) = await _session_pods(c, "j")
        assert (await c.delete("rolloutjobs", "j")).status_code in (200, 202)

        async def gone() -> bool:
            return not await _session_pods(c, "j") and await c.get("rolloutjobs", "j") is None

        await wait_for(gone, 60, "the job and its session pod gone")
        name = pod["metadata"]["name"]
        await wait_for(
            lambda: _not_running(c, name), 10, "the session process stopped by the kubelet"
        )
        written = len(read_records(out))
        await asyncio.sleep(1.5)
        assert len(read_records(out)) == written  # nothing writes the output any more


async def _not_running(c: Cluster, name: str) -> bool:
    run = c.kubelet.running.get(name)
    return run is None or run.process.poll() is not None


async def test_a_session_pod_that_cannot_start_is_reported_in_one_sentence(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as c:
        # Two pools: one job at a time runs on a pool, and the first never ends.
        await c.apply(pool("p", 1, [{"tp": 1, "replicas": 1}]))
        await c.apply(pool("q", 1, [{"tp": 1, "replicas": 1}]))
        image = {"image": "unpullable.invalid/heddle:0"}
        await c.apply(job("img", "p", tmp_path / "i.jsonl", session=image))
        claim = {
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "rollouts"}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        }
        await c.apply(job("vol", "q", tmp_path / "v.jsonl", session=claim))

        async def reported(name: str) -> dict[str, Any] | None:
            cond = _condition(await c.get("rolloutjobs", name), "SessionReady")
            return cond if cond and cond["reason"] == "SessionCannotStart" else None

        img = await wait_for(lambda: reported("img"), 60, "the image pull failure")
        assert img["status"] == "False"
        assert 'failed to pull image "unpullable.invalid/heddle:0"' in img["message"]
        assert "(ErrImagePull)" in img["message"] and "fix spec.session" in img["message"]
        assert "\n" not in img["message"]
        vol = await wait_for(lambda: reported("vol"), 60, "the missing volume claim")
        assert 'persistentvolumeclaim "rollouts" not found (Unschedulable)' in vol["message"]
        # The claim made: the pod starts and the job runs to its end.
        await c.http.post("/api/v1/namespaces/default/persistentvolumeclaims", json={
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "rollouts"}, "spec": {},
        })  # fmt: skip
        obj = await _finished(c, "vol")
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
        assert _condition(obj, "SessionReady")["status"] == "True"
        assert (await c.get("rolloutjobs", "img"))["status"]["phase"] != "Succeeded"


async def test_the_sessions_planned_shape_and_decisions_reach_the_pool_through_status(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        # No pinned shape: the pool starts homogeneous (4xTP1), the session's planner picks
        # the job's shape and publishes it in the job's status; the operator reshapes to it.
        await c.apply(pool("p", 4, tensorParallelSizes=[1, 2]))
        await c.apply(job("j", "p", out))

        async def planned() -> list[dict[str, int]] | None:
            status = (await c.get("rolloutjobs", "j") or {}).get("status") or {}
            return status.get("plannedShape")

        shape = await wait_for(planned, 120, "the job's plannedShape")
        assert sum(e["tp"] * e["replicas"] for e in shape) <= 4

        async def followed() -> dict[str, Any] | None:
            status = (await c.get("enginepools", "p") or {}).get("status") or {}
            desired = status.get("shape") or {}
            return desired if desired.get("source") == "planned" else None

        desired = await wait_for(followed, 60, "the pool following the planned shape")
        assert sorted(map(tuple, (e.values() for e in desired["desired"]))) == sorted(
            map(tuple, (e.values() for e in shape))
        )
        obj = await _finished(c, "j")
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
        assert_exactly_once(read_records(out), KEYS)
        assert max(c.kubelet.budget_log) <= 4, c.kubelet.budget_log
        # Its decisions, published in its status, are kept in the pool's status, and its
        # rollout on the job's volume (under the data root) for the pool's next job.
        first = obj["status"]["decisions"]
        assert first["reused"] is False and first["shape"] == shape
        kept = (await c.get("enginepools", "p"))["status"]["decisions"]
        assert kept == [first]
        history = c.tmp / ".heddle" / "history" / "default.p.json"
        after_first = history.read_text()
        assert len(json.loads(after_first)["records"]) == len(KEYS)

        # The next iteration (new output) starts from that rollout: other inputs, whose
        # decisions the first job's pod took ahead once it had ended (announced before
        # its final status, kept on the job's volume); the next job waits for them, or
        # finds them kept, and decides nothing. The pool keeps both records, latest first.
        await c.apply(job("j2", "p", tmp_path / "j2.jsonl"))
        obj = await _finished(c, "j2")
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
        second = obj["status"]["decisions"]
        assert second["reused"] is True and second["key"] != first["key"], second
        decisions = c.tmp / ".heddle" / "decisions"
        ahead = json.loads((decisions / f"{second['key']}.json").read_text())
        assert ahead["reused"] is False and ahead["decidedSeconds"] > 0.0
        assert (ahead["shape"], ahead["policy"]) == (second["shape"], second["policy"])

        async def both() -> list[str] | None:
            keys = [r["key"] for r in (await c.get("enginepools", "p"))["status"]["decisions"]]
            return keys if keys == [second["key"], first["key"]] else None

        await wait_for(both, 30, "both records kept")
        # A job on the same inputs again (that rollout put back) takes the pool's record.
        history.write_text(after_first)
        await c.apply(job("j3", "p", tmp_path / "j3.jsonl"))
        obj = await _finished(c, "j3")
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
        third = obj["status"]["decisions"]
        assert third["reused"] is True and third["key"] == second["key"], third
        assert third["shape"] == second["shape"] == obj["status"]["plannedShape"]
        assert_exactly_once(read_records(tmp_path / "j3.jsonl"), KEYS)


async def test_an_external_job_serves_its_gateway_from_the_session_pod(tmp_path: Path) -> None:
    out = tmp_path / "ext.jsonl"
    inline = {"inline": [{"id": "a", "prompt": "say hi"}, {"id": "b", "prompt": "say bye"}]}
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 1, [{"tp": 1, "replicas": 1}]))
        environment = {"type": "external", "external": {"idleTimeoutSeconds": 60}}
        sampling = {"maxTokensPerTurn": 8, "maxTotalTokens": 64}
        await c.apply(job("ext", "p", out, environment=environment, tasks=inline,
                          samplesPerTask=2, sampling=sampling))  # fmt: skip
        service = await wait_for(lambda: c.get("services", "ext-gateway"), 60, "the Service")
        assert service["spec"]["selector"] == {LABEL_JOB: "ext"}
        secret = await c.get("secrets", "ext-gateway-token")
        assert secret is not None and secret["metadata"]["ownerReferences"][0]["name"] == "ext"
        token = base64.b64decode(secret["data"]["token"]).decode()

        async def running() -> dict[str, Any] | None:
            status = (await c.get("rolloutjobs", "ext") or {}).get("status") or {}
            return status if status.get("gatewayURL") else None

        status = await wait_for(running, 120, "the gateway served")
        assert status["gatewayURL"] == "http://ext-gateway.default.svc:8080/v1"
        # No cluster DNS here: the session pod's address stands in for its Service.
        (pod,) = await _session_pods(c, "ext")
        base = f"http://{pod['status']['podIP']}:8080/v1"
        auth = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.post(f"{base}/episodes")).status_code == 401
            while True:
                episode = (await http.post(f"{base}/episodes", headers=auth)).json()
                if episode["id"] is None:
                    if episode["remaining"] == 0:
                        break
                    await asyncio.sleep(0.2)
                    continue
                messages = [{"role": "user",
                             "content": episode["task"]["messages"][0]["content"]}]  # fmt: skip
                reply = await http.post(
                    f"{base}/chat/completions",
                    headers={**auth, "X-Heddle-Trajectory": episode["id"]},
                    json={"model": episode["model"], "messages": messages, "max_tokens": 4},
                )
                assert reply.status_code == 200, reply.text
                ended = await http.post(
                    f"{base}/episodes/{episode['id']}/end", headers=auth, json={"reward": 1.0}
                )
                assert ended.status_code == 200, ended.text
        obj = await _finished(c, "ext")
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
        records = read_records(out)
        assert_exactly_once(records, {(t, s) for t in ("a", "b") for s in range(2)})
        assert {r["reward"] for r in records} == {1.0}


async def test_a_trainer_takes_the_jobs_batches_from_the_session_pod(tmp_path: Path) -> None:
    """spec.asynchrony.trainerApi on a cluster: the operator makes the token Secret and the
    ClusterIP Service (owned by the job), the session pod serves the trainer API on its
    trainer port, status.trainer says where, and a TrainerClient with the Secret's token
    takes every batch; the job ends once it did, each record written once."""
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        asynchrony = {"groupsPerIteration": 4, "trainerApi": True}
        await c.apply(job("t", "p", out, asynchrony=asynchrony))
        service = await wait_for(lambda: c.get("services", "t-trainer"), 60, "the Service")
        assert service["spec"]["type"] == "ClusterIP"
        assert service["spec"]["selector"] == {LABEL_JOB: "t", "app.kubernetes.io/name":
                                               "heddle-session"}  # fmt: skip
        assert service["spec"]["ports"] == [{"name": "trainer", "port": 8081,
                                             "targetPort": 8081}]  # fmt: skip
        secret = await c.get("secrets", "t-trainer-token")
        assert secret is not None
        uid = (await c.get("rolloutjobs", "t") or {})["metadata"]["uid"]
        for obj in (service, secret):
            assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
        assert base64.b64decode(secret["data"]["token"])

        async def serving() -> dict[str, Any] | None:
            status = (await c.get("rolloutjobs", "t") or {}).get("status") or {}
            return status if status.get("trainer") else None

        status = await wait_for(serving, 120, "the trainer API served")
        assert status["trainer"] == {"url": "http://t-trainer.default.svc:8081",
                                     "tokenSecret": "t-trainer-token"}  # fmt: skip
        (pod,) = await _session_pods(c, "t")
        (container,) = pod["spec"]["containers"]
        assert {"name": "trainer", "containerPort": 8081} in container["ports"]
        env = {e["name"]: e for e in container["env"]}
        assert env["HEDDLE_TRAINER_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "t-trainer-token", "key": "token"}  # fmt: skip
        # No cluster DNS here: the session pod's address stands in for its Service.
        base = f"http://{pod['status']['podIP']}:8081"
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.get(f"{base}/v1/stream")).status_code == 401
        batches = []
        # The Secret's token and the job's status, read as a trainer would (the URL given:
        # no cluster DNS here).
        trainer = await TrainerClient.for_job("t", access=ClusterAccess(c.url), url=base,
                                              poll_s=5.0)  # fmt: skip
        async with trainer:
            async for batch in trainer.batches():
                batches.append(batch)
        obj = await _finished(c, "t")
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
    taken = [(r["task_id"], r["sample"]) for b in batches for g in b["groups"]
             for r in g["records"]]  # fmt: skip
    assert len(batches) == 4 and all(len(b["groups"]) == 4 for b in batches), batches
    assert sorted(taken) == sorted(KEYS)
    assert_exactly_once(read_records(out), KEYS)
