"""A job's files against the operator: read only by the job's session pod, never echoed.

The operator runs in-process against the HTTP API server (``_operator_fixture``)
with its data root (where session pods resolve relative paths) at the test's
``tmp_path``; jobs name files that are not what they should be, and one
output twice.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from ._operator_fixture import cluster, job, pool, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # slow: real processes, see pyproject

SECRET = "eyJhbGciOi-s3cr3t-service-account-token"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _synthetic(workload: str) -> dict[str, Any]:
    return {"type": "synthetic", "synthetic": {"workload": workload}}


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    found = [c for c in obj["status"]["conditions"] if c["type"] == kind]
    assert found, obj["status"]
    return found[0]


async def _failed(c: Any, name: str, timeout: float = 60) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        obj = await c.get("rolloutjobs", name)
        phase = ((obj or {}).get("status") or {}).get("phase")
        assert phase != "Succeeded", obj
        return obj if phase == "Failed" else None

    return await wait_for(probe, timeout, f"job {name} Failed")


async def test_files_that_are_not_workloads_fail_in_the_session_pod_without_echoing_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "token").write_text(SECRET)
    (tmp_path / "token").write_text(SECRET)
    (tmp_path / "kubeconfig.yaml").write_text(f"{SECRET}: {SECRET}\nusers: [{SECRET}]\n")
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    # The operator reads no file of a job: its session pod does, on the pod's own volumes
    # (here the test host's files), with the pod's identity. An absolute path is read as it is.
    jobs = {
        "absolute": (_synthetic(str(outside / "token")), "expected a mapping, got a str"),
        "token": (_synthetic("token"), "expected a mapping, got a str"),
        "mapping": (_synthetic("kubeconfig.yaml"), "missing field(s)"),
        "latin1": (_synthetic("latin1.yaml"), "is not UTF-8 text (line 1"),
    }
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 1, [{"tp": 1, "replicas": 1}]))
        for name, (environment, _) in jobs.items():
            body = job(name, "p", tmp_path / f"{name}.jsonl", environment=environment)
            reply = await c.apply(body)
            assert reply.status_code in (200, 201), reply.text
        for name, (_, message) in jobs.items():
            obj = await _failed(c, name, 120)
            valid = _condition(obj, "Valid")
            assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
            assert message in valid["message"], (name, valid["message"])
            assert "\n" not in valid["message"] and "Traceback" not in valid["message"]
        seen = json.dumps([await c.list("rolloutjobs"), await c.list("events")])
    assert SECRET not in seen
    assert SECRET not in caplog.text
    sessions = [f for f in (tmp_path / "logs").glob("*-session-*.log")]
    assert len(sessions) == len(jobs)
    assert not any(SECRET in f.read_text() for f in sessions)


async def test_second_job_on_the_same_output_is_refused(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        # Neither has a pool: the first waits (Pending), the second is refused at once.
        await c.apply(job("a-first", "nope", tmp_path / "shared.jsonl"))
        await wait_for(
            lambda: _phase(c, "a-first", "Pending"), 30, "the first job waiting for its pool"
        )
        await c.apply(job("b-second", "nope", Path("shared.jsonl")))  # relative: the same file
        obj = await _failed(c, "b-second")
        valid = _condition(obj, "Valid")
        assert valid["reason"] == "OutputInUse"
        assert "RolloutJob 'a-first' writes to the same spec.output.path" in valid["message"]
        assert (await c.get("rolloutjobs", "a-first"))["status"]["phase"] == "Pending"


async def _phase(c: Any, name: str, phase: str) -> bool:
    obj = await c.get("rolloutjobs", name)
    return bool(((obj or {}).get("status") or {}).get("phase") == phase)


async def test_unusable_outputs_and_inputs_fail_the_job_and_are_left_untouched(
    tmp_path: Path,
) -> None:
    (tmp_path / "plain").write_text("not a folder\n")
    (tmp_path / "notes.txt").write_text(f"my notes\n{SECRET}")  # no final newline: 'torn'?
    before = (tmp_path / "notes.txt").read_bytes()
    (tmp_path / "tasks.jsonl").write_bytes(b'{"id": "a", "prompt": "\xff"}\n')
    small = _synthetic("quickstart")
    async with cluster(tmp_path) as c:
        await c.apply(pool("p", 1, [{"tp": 1, "replicas": 1}]))
        await c.apply(job("underfile", "p", tmp_path / "plain" / "out.jsonl", environment=small))
        await c.apply(job("notours", "p", tmp_path / "notes.txt", environment=small))
        tasks = {"tasks": {"path": "tasks.jsonl"}, "environment": {"type": "tools"}}
        await c.apply(job("latin1tasks", "p", tmp_path / "l.jsonl", **tasks))
        underfile = await _failed(c, "underfile", 120)
        under = _condition(underfile, "Complete")
        assert under["reason"] == "SessionFailed"
        assert _condition(underfile, "Failed") == {**under, "type": "Failed", "status": "True"}
        assert "cannot create the output folder" in under["message"]
        notours = _condition(await _failed(c, "notours", 120), "Complete")
        assert "line 1 is not a Heddle output record" in notours["message"]
        latin1 = _condition(await _failed(c, "latin1tasks", 120), "Complete")
        assert f"the task file {tmp_path / 'tasks.jsonl'} is not UTF-8 text" in latin1["message"]
        seen = json.dumps([await c.list("rolloutjobs"), await c.list("events")])
    assert SECRET not in seen
    assert (tmp_path / "notes.txt").read_bytes() == before
