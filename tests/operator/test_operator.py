"""The operator through kopf against an API server over HTTP, with real worker processes."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest

from heddle.operator import run_operator
from heddle.rollout import HostAllowList

from .._rollout_fixtures import assert_exactly_once, read_records
from ._operator_fixture import FAST, cluster, job, pool, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # slow: real processes, see pyproject


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions", []):
        if c["type"] == kind:
            return c
    return None


def _no_errors(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


async def test_pool_gets_pods_with_gpus_and_labels_then_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with cluster(tmp_path) as c:
        reply = await c.apply(pool("p", 4, [{"tp": 2, "replicas": 1}, {"tp": 1, "replicas": 2}]))
        assert reply.status_code in (200, 201), reply.text

        async def ready() -> dict[str, Any] | None:
            obj = await c.get("enginepools", "p")
            cond = _condition(obj, "Ready")
            return obj if cond and cond["status"] == "True" else None

        obj = await wait_for(ready, 60, "pool Ready")
        pods = await c.list("pods")
        assert sorted(p["metadata"]["name"] for p in pods) == ["p-tp1-0", "p-tp1-1", "p-tp2-0"]
        for p in pods:
            tp = p["metadata"]["labels"]["heddle.dev/tp"]
            limits = p["spec"]["containers"][0]["resources"]["limits"]
            assert limits["nvidia.com/gpu"] == tp
            assert p["metadata"]["labels"]["heddle.dev/pool"] == "p"
            assert p["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
        assert obj["status"]["shape"]["summary"] == "1xTP2 + 2xTP1"
        assert obj["status"]["shape"]["readySummary"] == "3/3"
        assert all(i["phase"] == "Ready" and i["endpoint"] for i in obj["status"]["instances"])
        assert await c.get("services", "p") is not None
        assert max(c.kubelet.budget_log) <= 4
        # The pool's daemon reads its pods from kopf's index (a watch), never LISTs them, while
        # rounds run every 0.3 s; the test kubelet's own polling LISTs are not the operator's.
        assert c.api is not None
        seen = len(c.api.seen)
        await asyncio.sleep(1.5)
        pods_path = "/api/v1/namespaces/default/pods"
        ours = [a for m, p, a, _ in c.api.seen if (m, p) == ("GET", pods_path) and "OpenAPI" in a]
        assert ours == [], ours
        watches = [q for _, p, a, q in c.api.seen if p == pods_path and "kopf" in a]
        # Filtered by the server: the watch never streams pods that are not a pool's workers.
        assert watches and all(q.get("labelSelector") == "heddle.dev/pool" for q in watches)
        assert len(c.api.seen) > seen  # the server was being asked meanwhile

        async def created() -> list[str]:  # posted by kopf's event poster, asynchronously
            names = sorted(
                e["message"] for e in await c.list("events")
                if e["reason"] == "Created" and e["source"]["component"] == "heddle-operator"
            )  # fmt: skip
            return names if len(names) >= 3 else []

        assert await wait_for(created, 30, "Created events") == [
            "created instance p-tp1-0 (TP1)", "created instance p-tp1-1 (TP1)",
            "created instance p-tp2-0 (TP2)",
        ]  # fmt: skip
    _no_errors(caplog)


async def test_job_runs_to_succeeded_with_every_trajectory_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        reply = await c.apply(job("j", "p", out))
        assert reply.status_code in (200, 201), reply.text

        obj = await _finished(c, "j")
        status = obj["status"]
        assert status["phase"] == "Succeeded", status
        assert (status["done"], status["failed"], status["total"]) == (64, 0, 64)
        assert status["progress"] == "64/64"
        assert _condition(obj, "Complete")["status"] == "True"
        assert _condition(obj, "Failed") is None  # `kubectl wait --for=condition=Failed` waits on
        keys = {(f"p{i:05d}", s) for i in range(16) for s in range(4)}
        assert_exactly_once(read_records(out), keys)
    _no_errors(caplog)


async def _finished(c: Any, name: str, timeout: float = 180) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        obj = await c.get("rolloutjobs", name)
        phase = ((obj or {}).get("status") or {}).get("phase")
        return obj if phase in ("Succeeded", "Failed") else None

    return await wait_for(probe, timeout, f"job {name} finished")


async def _records_at_least(out: Path, n: int) -> None:
    async def probe() -> bool:
        return out.exists() and len(read_records(out)) >= n

    await wait_for(probe, 120, f"{n} records in {out.name}")


KEYS = {(f"p{i:05d}", s) for i in range(16) for s in range(4)}
SIX_TURNS = {
    "type": "synthetic",
    "synthetic": {"workload": {
        "name": "six-turns", "prompts": 16, "samples_per_prompt": 4,
        "prompt_tokens": {"median": 100, "sigma": 0.1, "min": 32, "max": 200},
        "output_tokens": {"median": 300, "group_sigma": 0.1, "within_sigma": 0.1, "max": 600},
        "turns": {"median": 6, "length_exponent": 0.0, "sigma": 0.0, "max": 6},
        "tools": [{"name": "sandbox", "latency_s": {"mean": 1.0, "sigma": 0.1, "max": 2},
                   "output_tokens": {"median": 40, "sigma": 0.3, "min": 8, "max": 100}}],
    }},
}  # fmt: skip
SLOW_TOOLS = {"type": "synthetic", "synthetic": {"workload": "quickstart", "toolTimeScale": 2.0}}


async def test_reshape_drains_migrates_and_never_exceeds_the_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="heddle")  # drains and moves, for a failure's story
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 4, [{"tp": 1, "replicas": 4}], tensorParallelSizes=[1, 2]))
        # Every trajectory makes five tool calls of about a second, and the pool reshapes
        # once some are in tools, draining three of the four workers: wherever placement
        # put the trajectories (it may pack them onto a few workers), most sit on drained
        # workers with tool calls ahead, and leave them by migration.
        await c.apply(job("j", "p", out, environment=SIX_TURNS))

        async def in_tools() -> bool:
            status = (await c.get("rolloutjobs", "j") or {}).get("status") or {}
            return int(status.get("inTool", 0)) >= 8

        await wait_for(in_tools, 120, "trajectories in tool calls")
        before = {p["metadata"]["name"] for p in await c.list("pods")}
        reply = await c.patch("enginepools", "p", {"spec": {"shape": [
            {"tp": 2, "replicas": 1}, {"tp": 1, "replicas": 1}]}})  # fmt: skip
        assert reply.status_code == 200, reply.text

        async def reshaped() -> bool:
            obj = await c.get("enginepools", "p")
            cond = _condition(obj, "Reshaping")
            ready = _condition(obj, "Ready")
            return bool(cond and cond["status"] == "False" and ready and ready["status"] == "True"
                        and obj["status"]["shape"]["summary"] == "1xTP2 + 1xTP1")  # fmt: skip

        await wait_for(reshaped, 120, "the new shape")
        obj = await _finished(c, "j")
        assert obj["status"]["phase"] == "Succeeded"
        records = read_records(out)
        assert_exactly_once(records, KEYS)
        workers = [p for p in await c.list("pods") if "heddle.dev/pool" in p["metadata"]["labels"]]
        assert sorted(p["metadata"]["labels"]["heddle.dev/tp"] for p in workers) == ["1", "2"]
        assert max(c.kubelet.budget_log) <= 4, c.kubelet.budget_log
        drained = before - {p["metadata"]["name"] for p in await c.list("pods")}
        assert drained == {"p-tp1-1", "p-tp1-2", "p-tp1-3"}  # the newest go first
        moved = [m for r in records for m in r["placement"]["migrations"] if m["from"] in drained]
        story = [
            r.getMessage() for r in caplog.records if any(d in r.getMessage() for d in drained)
        ]
        assert moved, "no trajectory migrated off a draining instance:\n" + "\n".join(story)
        events = [e["reason"] for e in await c.list("events")]
        assert "Draining" in events and "Deleted" in events
    _no_errors(caplog)


async def test_worker_pod_deleted_mid_job_is_replaced_and_nothing_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        await c.apply(job("j", "p", out))
        await _records_at_least(out, 6)
        first_ip = c.kubelet.running["p-tp1-0"].ip
        assert (await c.delete("pods", "p-tp1-0")).status_code == 200

        async def replaced() -> bool:
            run = c.kubelet.running.get("p-tp1-0")
            return run is not None and run.ip != first_ip

        await wait_for(replaced, 60, "a replacement pod")
        obj = await _finished(c, "j")
        assert obj["status"]["phase"] == "Succeeded"
        assert_exactly_once(read_records(out), KEYS)
    _no_errors(caplog)


async def test_operator_restart_mid_job_resumes_without_duplicates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out.jsonl"
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        await c.apply(job("j", "p", out, environment=SLOW_TOOLS))
        await _records_at_least(out, 6)
        await c.stop_operator()
        before = len(read_records(out))
        assert before < 64
        await c.start_operator()
        obj = await _finished(c, "j")
        assert obj["status"]["phase"] == "Succeeded"
        assert_exactly_once(read_records(out), KEYS)
        assert obj["status"]["done"] == 64
    _no_errors(caplog)


async def test_two_jobs_on_one_pool_run_in_creation_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 2, [{"tp": 1, "replicas": 2}]))
        small = {"type": "synthetic", "synthetic": {"workload": "quickstart", "toolTimeScale": 0.2}}
        await c.apply(job("first", "p", tmp_path / "a.jsonl", samplesPerTask=1, environment=small))
        await c.apply(job("second", "p", tmp_path / "b.jsonl", samplesPerTask=1, environment=small))

        async def second_queued() -> dict[str, Any] | None:
            obj = await c.get("rolloutjobs", "second")
            return obj if ((obj or {}).get("status") or {}).get("phase") == "Queued" else None

        queued = await wait_for(second_queued, 60, "the second job Queued")
        assert "'first'" in _condition(queued, "Running")["message"]
        first = await _finished(c, "first")
        second = await _finished(c, "second")
        assert first["status"]["phase"] == second["status"]["phase"] == "Succeeded"
        assert second["status"]["startTime"] >= first["status"]["completionTime"]
    _no_errors(caplog)


async def test_invalid_specs_are_rejected_or_reported(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        # Rejected by the CRD schema (the API server answers 422).
        bad = job("bad", "p", tmp_path / "x.jsonl", samplesPerTask=0)
        reply = await c.apply(bad)
        assert reply.status_code == 422 and "samplesPerTask" in reply.text
        reply = await c.apply(pool("bad", 0))
        assert reply.status_code == 422
        # Cross-field rules the schema cannot express: the CRDs' CEL rules (422 with their message).
        reply = await c.apply(
            pool("big", 2, [{"tp": 2, "replicas": 2}], tensorParallelSizes=[1, 2])
        )
        assert reply.status_code == 422 and "more GPUs" in reply.text
        reply = await c.apply(
            job("notasks", "p", tmp_path / "n.jsonl", environment={"type": "tools"})
        )
        assert reply.status_code == 422 and "spec.tasks is required" in reply.text
        # Valid for the API server, reported by a condition.
        await c.apply(job("orphan", "nope", tmp_path / "o.jsonl"))
        await c.apply(pool("tp", 2, vllm={"extraArgs": ["tensor_parallel_size=2"]}))
        inline = {"inline": [{"answer": "no prompt"}]}  # malformed rows are skipped: none left
        await c.apply(pool("ok", 1, [{"tp": 1, "replicas": 1}]))
        await c.apply(job("badrow", "ok", tmp_path / "n.jsonl", tasks=inline,
                          environment={"type": "tools"}))  # fmt: skip

        async def reported() -> bool:
            orphan = _condition(await c.get("rolloutjobs", "orphan"), "PoolReady")
            degraded = _condition(await c.get("enginepools", "tp"), "Degraded")
            badrow = await c.get("rolloutjobs", "badrow")
            return bool(
                orphan and degraded and (badrow or {}).get("status", {}).get("phase") == "Failed"
            )

        await wait_for(reported, 60, "conditions on the invalid objects")
        orphan = await c.get("rolloutjobs", "orphan")
        assert orphan["status"]["phase"] == "Pending"
        assert "EnginePool 'nope' does not exist" in _condition(orphan, "PoolReady")["message"]
        degraded = _condition(await c.get("enginepools", "tp"), "Degraded")
        assert degraded["reason"] == "InvalidSpec" and "tensor_parallel_size" in degraded["message"]
        assert degraded["observedGeneration"] == 1
        badrow = await c.get("rolloutjobs", "badrow")
        cause = _condition(badrow, "Complete")
        assert "no task to run" in cause["message"] and cause["observedGeneration"] == 1, cause
        failed = _condition(badrow, "Failed")  # `kubectl wait --for=condition=Failed` returns
        assert failed["status"] == "True" and failed["reason"] == cause["reason"]
        assert failed["message"] == cause["message"]


async def test_tool_host_outside_the_operators_allow_list_fails_the_job(tmp_path: Path) -> None:
    async with cluster(tmp_path, operator=False) as c:
        c.stop = asyncio.Event()
        allowed = HostAllowList.parse("127.0.0.1", "--tool-allowed-hosts")
        config = dataclasses.replace(FAST, api_server=c.url, tool_hosts=allowed)
        c.operator = asyncio.create_task(run_operator(config, stop_flag=c.stop))
        tools = {"endpoints": [{"name": "meta", "url": "http://169.254.169.254/x"}]}
        environment = {"type": "tools", "tools": tools}
        inline = {"inline": [{"prompt": "x"}]}
        await c.apply(job("meta", "p", tmp_path / "m.jsonl", environment=environment, tasks=inline))

        async def failed() -> dict[str, Any] | None:
            body = await c.get("rolloutjobs", "meta")
            return body if (body or {}).get("status", {}).get("phase") == "Failed" else None

        body = await wait_for(failed, 60, "the job to fail validation")
        valid = _condition(body, "Valid")
        assert valid is not None and valid["reason"] == "InvalidSpec"
        assert valid["message"].startswith(
            "RolloutJob 'meta' spec.environment.tools.endpoints[0].url http://169.254.169.254/x: "
            "host '169.254.169.254' is not among the hosts this operator lets tools reach "
            "(HEDDLE_TOOL_ALLOWED_HOSTS; with the Helm chart, operator.toolAllowedHosts)"
        )


async def test_spec_change_rolls_pods_one_at_a_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 3, [{"tp": 1, "replicas": 3}]))

        async def hashes() -> set[str] | None:
            pods = await c.list("pods")
            ready = [p for p in pods if (p.get("status") or {}).get("podIP")]
            if len(ready) != 3:
                return None
            return {p["metadata"]["annotations"]["heddle.dev/spec-hash"] for p in ready}

        (old,) = await wait_for(hashes, 60, "three ready pods")
        seen_at_once: list[int] = []
        await c.patch("enginepools", "p", {"spec": {"image": "ghcr.io/heddle-dev/heddle-worker:2"}})

        async def rolled() -> bool:
            pods = await c.list("pods")
            leaving = [
                p for p in pods
                if p["metadata"]["annotations"].get("heddle.dev/spec-hash") == old
                and ((p["metadata"].get("annotations") or {}).get("heddle.dev/draining") == "true"
                     or p["metadata"].get("deletionTimestamp"))
            ]  # fmt: skip
            seen_at_once.append(len(leaving))
            now = {p["metadata"]["annotations"]["heddle.dev/spec-hash"] for p in pods}
            ready = [p for p in pods if (p.get("status") or {}).get("podIP")]
            return old not in now and len(ready) == 3

        await wait_for(rolled, 120, "every pod on the new spec")
        assert max(seen_at_once) <= 1, seen_at_once
        assert max(c.kubelet.budget_log) <= 3
        pods = await c.list("pods")
        assert {p["spec"]["containers"][0]["image"] for p in pods} == {
            "ghcr.io/heddle-dev/heddle-worker:2"
        }
    _no_errors(caplog)
