"""A Heddle output file replays as a benchmark workload: "would Heddle help on my rollouts?"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .._rollout_fixtures import read_records

pytestmark = pytest.mark.slow  # real processes or engines; `-m 'not slow'` skips them

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "examples" / "synthetic"


def test_a_sim_rollouts_output_replays_with_its_own_turns_and_tool_times(tmp_path: Path) -> None:
    output = tmp_path / "rollout.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "heddle", "run", str(QUICK / "job.yaml"),
         "--pool", str(QUICK / "pool.yaml"), "--engine", "sim", "--time-scale", "0.05",
         "--output", str(output), "--quiet"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    records = read_records(output)
    bench = subprocess.run(
        [sys.executable, "-m", "heddle", "bench", "--workload", str(output), "--gpus", "2",
         "--policies", "heddle,verl", "--baseline-caps", "none", "--quiet",
         "--out", str(tmp_path / "bench")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    report = json.loads((tmp_path / "bench" / "results.json").read_text())
    done = [r for r in records if r["status"] == "done"]
    assert report["trajectories"] == len(done) > 0
    generated = sum(r["tokens"]["generated"] for r in done)
    assert report["policies"]["heddle"]["tokens"] == generated
    tool_s = sum(sum(r["trace"]["tool_latency_s"][: r["turns"] - 1]) for r in done)
    assert tool_s > 0  # the scripted tool latencies were measured and carried over
