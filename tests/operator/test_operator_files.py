"""A hostile tenant against the operator: every path a job names stays in the data root.

The operator runs in-process against the HTTP API server (``_operator_fixture``)
with its data root at the test's ``tmp_path``; jobs name files inside and
outside it, files that are not what they should be, and one output twice.
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


async def test_paths_outside_the_data_root_and_non_workloads_fail_without_echoing_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "token").write_text(SECRET)
    (tmp_path / "token").write_text(SECRET)  # inside the root, but no workload
    (tmp_path / "kubeconfig.yaml").write_text(f"{SECRET}: {SECRET}\nusers: [{SECRET}]\n")
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    (tmp_path / "escape").symlink_to(outside)
    jobs = {
        "absolute": (_synthetic(str(outside / "token")), {}, "outside the operator's data root"),
        "dotdot": (
            {"type": "tools"},
            {"tasks": {"path": f"../{outside.name}/token"}},
            "spec.tasks.path='../",
        ),
        "symlink": (_synthetic("escape/token"), {}, "outside the operator's data root"),
        "output": (
            _synthetic("quickstart"),
            {"output": {"path": "escape/out.jsonl"}},
            "spec.output.path='escape/out.jsonl' lies outside",
        ),
        "token": (_synthetic("token"), {}, "expected a mapping, got a str"),
        "mapping": (_synthetic("kubeconfig.yaml"), {}, "missing field(s)"),
        "latin1": (_synthetic("latin1.yaml"), {}, "is not UTF-8 text (line 1"),
    }
    async with cluster(tmp_path) as c:
        for name, (environment, extra, _) in jobs.items():
            body = job(name, "p", tmp_path / f"{name}.jsonl", environment=environment)
            body["spec"].update(extra)
            reply = await c.apply(body)
            assert reply.status_code in (200, 201), reply.text
        for name, (_, _, message) in jobs.items():
            obj = await _failed(c, name)
            valid = _condition(obj, "Valid")
            assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
            assert message in valid["message"], (name, valid["message"])
            assert "\n" not in valid["message"] and "Traceback" not in valid["message"]
        seen = json.dumps([await c.list("rolloutjobs"), await c.list("events")])
    assert SECRET not in seen
    assert SECRET not in caplog.text
    assert not (outside / "out.jsonl").exists()


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
