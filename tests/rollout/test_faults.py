"""Fault injection: ``heddle run`` and its sim workers killed, stopped and restarted at random.

A seeded schedule (``HEDDLE_FAULT_SEED`` replays one) injects a bounded number
of faults into a small synthetic job: SIGKILL or SIGTERM of ``heddle run``
followed by a fresh run on the same output, SIGSTOP/SIGCONT of the run or of a
worker, SIGKILL of one worker. After every fault the output holds no
trajectory twice; at the end, every trajectory is there exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .._rollout_fixtures import assert_exactly_once
from .test_run import QUICK, _alive, _children, _job

pytestmark = pytest.mark.slow  # real processes or engines; `-m 'not slow'` skips them

SEED = int(os.environ.get("HEDDLE_FAULT_SEED", "20261122"))
FAULTS = 6  # injected faults at most
BUDGET_S = 75.0  # time for the faults; the last run then finishes undisturbed
KEYS = {(f"p{i:05d}", s) for i in range(16) for s in range(4)}


def _write_job(tmp: Path) -> Path:
    synthetic = {"workload": str(QUICK / "workload.yaml"), "toolTimeScale": 2.0}
    spec = {"samplesPerTask": 4, "environment": {"type": "synthetic", "synthetic": synthetic}}
    return _job(tmp, spec, name="faults")


def _keys(output: Path) -> list[tuple[str, int]]:
    """Keys of the complete lines (a kill may only ever cut the last one)."""
    if not output.exists():
        return []
    data = output.read_bytes()
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    return [(r["task_id"], r["sample"]) for r in map(json.loads, lines)]


def _start(job: Path, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    args = ["run", str(job), "--engine", "sim", "--time-scale", "0.05", "--quiet"]
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "heddle", *args], cwd=cwd, stdout=out, stderr=out
        )


def _wait_gone(pids: list[int], timeout_s: float = 15.0) -> None:
    end = time.monotonic() + timeout_s
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids), f"processes {pids} outlived their run"


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _restart_after_a_failed_start(
    proc: subprocess.Popen[bytes], job: Path, tmp: Path, log: Path, history: list[str]
) -> subprocess.Popen[bytes]:
    """A worker killed before it was ready fails its run (exit 2, one sentence); run again."""
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.startswith("heddle: ")]
    assert proc.returncode == 2 and "while starting" in lines[-1], (SEED, history, lines[-3:])
    history.append("restart after a failed start")
    return _start(job, tmp, log)


def test_random_kills_stops_and_restarts_keep_every_trajectory_exactly_once(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    job = _write_job(tmp_path)
    output = tmp_path / "out" / "rollout.jsonl"
    log = tmp_path / "runs.log"
    history: list[str] = []  # what was injected, for the failure message
    proc = _start(job, tmp_path, log)
    stopped: list[int] = []
    started = time.monotonic()
    try:
        while len(history) < FAULTS and time.monotonic() - started < BUDGET_S:
            # Some progress between faults, so each lands mid-run rather than at start-up.
            target = len(_keys(output)) + rng.randint(2, 10)
            while (
                len(_keys(output)) < target
                and proc.poll() is None
                and time.monotonic() - started < BUDGET_S
            ):
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.5))
            if proc.poll() == 0:
                break  # finished before the next fault: nothing more to disturb
            if proc.poll() is not None:
                proc = _restart_after_a_failed_start(proc, job, tmp_path, log, history)
                continue
            workers = [p for p in _children(proc.pid) if _alive(p)]  # not the unreaped dead
            fault = rng.choice(["kill-run", "term-run", "stop-run", "kill-worker", "stop-worker"])
            done = len(_keys(output))
            history.append(f"{fault} at {done} records")
            if fault in ("kill-run", "term-run"):
                _signal(proc.pid, signal.SIGKILL if fault == "kill-run" else signal.SIGTERM)
                proc.wait(timeout=60)
                _wait_gone(workers)
                keys = _keys(output)
                assert len(keys) == len(set(keys)), (SEED, history)
                proc = _start(job, tmp_path, log)
            elif fault == "stop-run" or (fault == "stop-worker" and workers):
                target = proc.pid if fault == "stop-run" else rng.choice(workers)
                _signal(target, signal.SIGSTOP)
                stopped.append(target)
                time.sleep(rng.uniform(0.2, 2.0))
                _signal(target, signal.SIGCONT)
                stopped.remove(target)
            elif fault == "kill-worker" and len(workers) == 2:
                # The other one carries on; with none left, a run waits no_worker_timeout_s.
                _signal(rng.choice(workers), signal.SIGKILL)
            else:
                history[-1] += " (skipped: no worker to spare)"
        if proc.wait(timeout=120) != 0:
            proc = _restart_after_a_failed_start(proc, job, tmp_path, log, history)
        code = proc.wait(timeout=120)
    finally:
        for pid in stopped:
            _signal(pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text(errors="replace")
    assert code == 0, (SEED, history, out[-3000:])
    summaries = [line for line in out.splitlines() if line.startswith("faults: ")]
    assert "0 failed of 64 trajectories" in summaries[-1], (SEED, history, summaries)
    assert_exactly_once([{"task_id": t, "sample": s} for t, s in _keys(output)], KEYS)
    print(f"seed {SEED}: {history}")  # shown with -s, and on failure
    assert history, "no fault was injected"
