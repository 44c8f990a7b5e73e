"""``heddle run`` as a user runs it: a subprocess, manifests on disk, the simulated engine."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from .._rollout_fixtures import ToolServer, assert_exactly_once, read_records

pytestmark = pytest.mark.slow  # real processes or engines; `-m 'not slow'` skips them

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "examples" / "synthetic"


def _heddle(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "heddle", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _job(tmp: Path, spec: dict[str, object], name: str = "job") -> Path:
    docs = [
        {
            "apiVersion": "heddle.dev/v1alpha1",
            "kind": "EnginePool",
            "metadata": {"name": "local"},
            "spec": {
                "model": "tiny",
                "gpus": 2,
                "gpusPerNode": 2,
                "shape": [{"tp": 1, "replicas": 2}],
            },
        },
        {
            "apiVersion": "heddle.dev/v1alpha1",
            "kind": "RolloutJob",
            "metadata": {"name": name},
            "spec": {"enginePool": "local", "output": {"path": "out/rollout.jsonl"}, **spec},
        },
    ]
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_tools_job_with_malformed_tasks(tmp_path: Path, tool_server: ToolServer) -> None:
    call = '<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>'
    lines = [
        json.dumps({"id": "a", "prompt": f"<reply>{call}</reply><reply>it is 1</reply>"}),
        '{"id": "b", "prompt": ',
        json.dumps({"id": "c", "prompt": "<reply>no tool</reply>"}),
        json.dumps({"id": "d"}),
    ]
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    endpoint = {"name": "calc", "url": tool_server.url + "/ok", "timeoutSeconds": 2}
    job = _job(
        tmp_path,
        {
            "tasks": {"path": "tasks.jsonl"},
            "samplesPerTask": 2,
            "environment": {"type": "tools", "tools": {"endpoints": [endpoint]}},
        },
    )
    proc = _heddle(
        "run", str(job), "--engine", "sim", "--scripted-replies", "--quiet", cwd=tmp_path
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "4 done, 0 failed of 4 trajectories" in out
    assert "line 2: not valid JSON" in out and "line 4: give either messages" in out
    records = read_records(tmp_path / "out" / "rollout.jsonl")
    assert_exactly_once(records, {("a", 0), ("a", 1), ("c", 0), ("c", 1)})
    summary = json.loads((tmp_path / "out" / "rollout.jsonl.summary.json").read_text())
    assert summary["progress"]["malformed_tasks"] == 2
    # How long the shape planner and the co-location decision took before the pool
    # started (what the simulator charges as decisions_s).
    assert isinstance(summary["decisions_s"], float) and summary["decisions_s"] >= 0.0
    assert len(tool_server.calls) == 2


def test_the_next_run_starts_from_the_previous_rollout_and_reuses_what_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HEDDLE_STATE_DIR")  # the default: .heddle in the folder it ran in
    # The synthetic example with its shape left to the planner, run as the next training
    # iterations would be: the same job, another output each time.
    for name in ("job.yaml", "workload.yaml"):
        (tmp_path / name).write_text((QUICK / name).read_text())
    pool = yaml.safe_load((QUICK / "pool.yaml").read_text())
    del pool["spec"]["shape"]
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    kept = tmp_path / ".heddle" / "history" / "tiny.json"

    def run(output: str, *extra: str) -> tuple[dict[str, Any], str]:
        proc = _heddle("run", "job.yaml", "--pool", "pool.yaml", "--engine", "sim",
                       "--time-scale", "0.2", "--quiet", "--output", f"out/{output}.jsonl",
                       *extra, cwd=tmp_path)  # fmt: skip
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        return json.loads((tmp_path / "out" / f"{output}.jsonl.summary.json").read_text()), out

    first, said = run("first")
    assert first["history_records"] == 0 and first["mechanisms"]["shape_source"] == "planned"
    assert not first["decisions"]["reused"] and "kept for the next run" in said
    after_first = kept.read_text()
    # The second starts from the first's 64 trajectories: other inputs, decided again.
    second, said = run("second")
    assert second["history_records"] == 64 and "previous rollout: 64 trajectories" in said
    assert not second["decisions"]["reused"]
    assert second["decisions"]["key"] != first["decisions"]["key"]
    # The same inputs again (the first rollout's records put back): reused, no time spent.
    kept.write_text(after_first)
    third, said = run("third")
    assert third["decisions"]["reused"] and third["decisions_s"] == 0.0
    assert third["decisions"]["key"] == second["decisions"]["key"]
    assert third["pool"]["shape"] == second["pool"]["shape"]
    assert "reused from an earlier run with the same inputs" in said
    kept.write_text(after_first)
    fourth, _ = run("fourth", "--fresh-decisions")
    assert not fourth["decisions"]["reused"]
    assert (tmp_path / ".heddle" / "decisions" / f"{second['decisions']['key']}.json").is_file()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_killed_run_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    spec = {
        "samplesPerTask": 4,
        "environment": {
            "type": "synthetic",
            "synthetic": {"workload": str(QUICK / "workload.yaml"), "toolTimeScale": 2.0},
        },
    }
    job = _job(tmp_path, spec)
    output = tmp_path / "out" / "rollout.jsonl"
    proc = _heddle(
        "run", str(job), "--engine", "sim", "--time-scale", "0.05", "--quiet", cwd=tmp_path
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (not output.exists() or len(read_records(output)) < 8):
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    workers = _children(proc.pid)
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(read_records(output))
    assert 8 <= written < 64
    for pid in workers:  # the workers die with the run that started them
        end = time.monotonic() + 15
        while _alive(pid) and time.monotonic() < end:
            time.sleep(0.1)
        assert not _alive(pid), f"worker {pid} outlived its heddle run"
    again = _heddle(
        "run", str(job), "--engine", "sim", "--time-scale", "0.05", "--quiet", cwd=tmp_path
    )
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out
    assert f"({written} already in the output)" in out
    keys = {(f"p{i:05d}", s) for i in range(16) for s in range(4)}
    assert_exactly_once(read_records(output), keys)


def test_bad_manifest_is_a_clear_error(tmp_path: Path) -> None:
    job = _job(tmp_path, {"samplesPerTask": 0, "tasks": {"inline": [{"prompt": "x"}]}})
    proc = _heddle("run", str(job), "--engine", "sim", cwd=tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "heddle: error: RolloutJob 'job' spec.samplesPerTask=0 must be in [1, 1024]" in out


def test_ctrl_c_stops_the_workers_and_keeps_what_finished(tmp_path: Path) -> None:
    spec = {
        "samplesPerTask": 4,
        "environment": {"type": "synthetic", "synthetic": {"workload": "quickstart"}},
    }
    job = _job(tmp_path, spec)
    output = tmp_path / "out" / "rollout.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "heddle", "run", str(job), "--engine", "sim", "--quiet"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - a terminal
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (not output.exists() or len(read_records(output)) < 4):
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in out, out
    assert not any(_alive(pid) for pid in workers)
    records = read_records(output)
    assert 4 <= len(records) < 64
    assert len({(r["task_id"], r["sample"]) for r in records}) == len(records)


def test_tool_host_outside_the_allow_list_is_refused(tmp_path: Path) -> None:
    endpoint = {"name": "meta", "url": "http://169.254.169.254/latest/meta-data"}
    job = _job(
        tmp_path,
        {
            "tasks": {"inline": [{"prompt": "x"}]},
            "environment": {"type": "tools", "tools": {"endpoints": [endpoint]}},
        },
    )
    env = {**os.environ, "HEDDLE_TOOL_ALLOWED_HOSTS": "127.0.0.1,*.tools.svc"}
    proc = subprocess.run(
        [sys.executable, "-m", "heddle", "run", str(job), "--engine", "sim"],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "heddle: error: RolloutJob 'job' spec.environment.tools.endpoints[0].url "
        "http://169.254.169.254/latest/meta-data: host '169.254.169.254' is not among the hosts "
        "this operator lets tools reach (HEDDLE_TOOL_ALLOWED_HOSTS; with the Helm chart, "
        "operator.toolAllowedHosts); use an allowed tool host or ask the admin to add it"
    )
    assert not (tmp_path / "out").exists()


SLOW_SYNTHETIC = {
    "samplesPerTask": 4,
    "environment": {
        "type": "synthetic",
        "synthetic": {"workload": str(QUICK / "workload.yaml"), "toolTimeScale": 2.0},
    },
}
KEYS = {(f"p{i:05d}", s) for i in range(16) for s in range(4)}


def _wait_for_records(proc: subprocess.Popen[str], output: Path, n: int) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (not output.exists() or len(read_records(output)) < n):
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)


def test_a_second_run_on_the_same_output_is_refused(tmp_path: Path) -> None:
    job = _job(tmp_path, SLOW_SYNTHETIC)
    output = tmp_path / "out" / "rollout.jsonl"
    args = ("run", str(job), "--engine", "sim", "--time-scale", "0.05", "--quiet")
    first = _heddle(*args, cwd=tmp_path)
    _wait_for_records(first, output, 4)
    second = _heddle(*args, cwd=tmp_path)
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 2, out
    assert out.strip() == (
        f"heddle: error: the output {output} is in use by another Heddle session "
        f"(pid {first.pid}); wait for it to finish or choose another spec.output.path "
        "(heddle run: --output)"
    )
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0 and "64 done, 0 failed of 64 trajectories" in out, out
    assert_exactly_once(read_records(output), KEYS)


@pytest.mark.parametrize(
    "case",
    ["output-under-a-file", "latin1-manifest", "latin1-tasks", "yaml-alias", "name", "samples"],
)
def test_bad_input_is_one_sentence_and_exit_2(tmp_path: Path, case: str) -> None:
    (tmp_path / "tasks.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    spec: dict[str, object] = {"tasks": {"path": "tasks.jsonl"}, "environment": {"type": "tools"}}
    name, expected = "job", ""
    if case == "output-under-a-file":
        (tmp_path / "out").write_text("a file, not a folder\n")
        expected = f"cannot create the output folder {tmp_path / 'out'}: File exists"
    elif case == "latin1-tasks":
        (tmp_path / "tasks.jsonl").write_bytes(b'{"id": "a", "prompt": "caf\xe9"}\n')
        expected = f"the task file {tmp_path / 'tasks.jsonl'} is not UTF-8 text (line 1, byte 27)"
    elif case == "name":
        name, expected = "rollout/step 1?", "RolloutJob.metadata.name='rollout/step 1?' is not"
    elif case == "samples":
        spec["samplesPerTask"] = 10**7
        expected = "RolloutJob 'job' spec.samplesPerTask=10000000 must be in [1, 1024]"
    job = _job(tmp_path, spec, name)
    if case == "latin1-manifest":
        job.write_bytes(job.read_bytes().replace(b"name: job", b"name: j\xf6b"))
        expected = f"the manifest {job} is not UTF-8 text (line "
    elif case == "yaml-alias":
        bomb = "\n".join(
            [f"a0: &a0 [{'x, ' * 9}x]"]
            + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
        )
        job.write_text(job.read_text() + f"---\n{bomb}\n")
        expected = "YAML aliases (*name) are not allowed; write the value out in full"
    proc = _heddle("run", str(job), "--engine", "sim", "--quiet", cwd=tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("heddle: error: "), out
    assert expected in lines[0], out


def _fill_the_disk_at(limit_bytes: int) -> Callable[[], None]:
    def limit() -> None:  # in the child: a full disk, as a file-size limit
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return limit


def test_a_full_disk_stops_the_run_with_whole_records_only(tmp_path: Path) -> None:
    job = _job(tmp_path, SLOW_SYNTHETIC)
    output = tmp_path / "out" / "rollout.jsonl"
    args = [sys.executable, "-m", "heddle", "run", str(job), "--engine", "sim", "--quiet"]
    proc = subprocess.Popen(
        [*args, "--time-scale", "0.05"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_fill_the_disk_at(60_000),  # noqa: PLW1509 - rlimits are set this way
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert f"heddle: error: writing to the output {output} failed: File too large" in out, out
    assert "Traceback" not in out
    data = output.read_bytes()
    assert data.endswith(b"\n") and 0 < len(data) <= 60_000
    written = read_records(output)  # every line a whole record
    assert 0 < len(written) < 64
    again = _heddle(*args[3:], "--time-scale", "0.05", cwd=tmp_path)
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out
    assert f"({len(written)} already in the output)" in out
    assert_exactly_once(read_records(output), KEYS)


def test_local_vllm_on_the_tiny_model_plans_with_the_shipped_cpu_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from heddle.api._manifests import EnginePoolSpec, VLLMSpec
    from heddle.rollout import TINY_DIR, LocalWorkerOptions
    from heddle.rollout._decide import plan_pool
    from heddle.rollout._run import perf_model_for, prepare_job
    from heddle.scheduler import PoolShape, ProfiledPerfModel

    monkeypatch.chdir(tmp_path)  # TINY_DIR is relative to where heddle run runs
    pool = EnginePoolSpec("p", "default", "tiny", "", 2, 2, (1,), None, VLLMSpec())
    tiny = LocalWorkerOptions(engine="vllm", model=str(TINY_DIR), max_num_seqs=8)
    perf = perf_model_for(pool, tiny)
    assert isinstance(perf, ProfiledPerfModel) and perf.profile.name == "vllm-cpu-tiny"
    assert perf.batch_cap == 8 and perf.step_overhead_s > 0
    # The same directory named absolutely is the same model.
    absolute = LocalWorkerOptions(engine="vllm", model=str(tmp_path / TINY_DIR))
    assert isinstance(perf_model_for(pool, absolute), ProfiledPerfModel)
    # Simulated workers, another model, or a cluster (no local options): the datasheet model.
    for options in (
        LocalWorkerOptions(engine="sim"),
        LocalWorkerOptions(engine="vllm", model=str(tmp_path / "other")),
        None,
    ):
        assert type(perf_model_for(pool, options)).__name__ == "PerfModel", options
    # The profile holds TP1 only: a pool pinned at TP2 plans on the datasheet model, one
    # that may choose is planned on TP1 alone.
    pinned = replace(pool, tensor_parallel_sizes=(1, 2), shape=PoolShape.of({2: 1}))
    assert type(perf_model_for(pinned, tiny)).__name__ == "PerfModel"
    free = replace(pool, tensor_parallel_sizes=(1, 2))
    examples = Path(__file__).resolve().parents[2] / "examples" / "synthetic"
    job = prepare_job(examples / "job.yaml", examples / "pool.yaml")
    local = replace(job, pool=free)
    plan = plan_pool(local, perf_model_for(free, tiny))
    assert set(plan.shape.tps()) == {1}
