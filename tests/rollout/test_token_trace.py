"""Token traces: a run writes each step's token ids, and the simulator replays them.

Fast: a session on simulated workers (real processes, HTTP) writes the trace; the
replay goes through the workload loader and the simulator.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from heddle.api import SamplingSpec
from heddle.bench import bench_predictor, chunked
from heddle.exceptions import WorkloadError
from heddle.rollout import (
    LocalPool,
    OutputSink,
    RolloutSession,
    SessionConfig,
    SyntheticEnvironment,
    load_bench_workload,
    load_cluster,
    load_workload,
    synthetic_tasks,
    trace_path,
)
from heddle.scheduler import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    TRACE_FORMAT,
    TRACE_VERSION,
    PerfModel,
    TrajectoryScript,
    get_policy,
)
from heddle.scheduler.sim import Simulator
from heddle.worker import WorkerEndpoint

from .._rollout_fixtures import read_records

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = load_workload(str(ROOT / "examples" / "synthetic" / "workload.yaml"))
PERF = PerfModel(MODEL_PRESETS["qwen3-8b"], HARDWARE_PRESETS["h100-sxm"])
FAST = SessionConfig(replan_interval_s=0.3, health_interval_s=0.2, unhealthy_after=2)


def _run_traced(workers: list[WorkerEndpoint], output: Path, tasks: int, samples: int) -> None:
    env = SyntheticEnvironment(WORKLOAD, tasks, samples, seed=0, tool_time_scale=0.05)
    session = RolloutSession(
        job="t",
        tasks=synthetic_tasks(tasks, WORKLOAD, seed=0),
        samples_per_task=samples,
        environment=env,
        workers=workers,
        sink=OutputSink(output),
        perf=PERF,
        sampling=SamplingSpec(max_tokens_per_turn=2048, max_total_tokens=3000),
        max_turns=8,
        config=FAST,
        trace=OutputSink(trace_path(output)),
    )
    asyncio.run(session.run())


@pytest.mark.slow
def test_a_traced_run_replays_in_the_simulator_with_its_own_steps(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    output = tmp_path / "rollout.jsonl"
    _run_traced(workers, output, tasks=6, samples=4)
    records = {(r["task_id"], r["sample"]): r for r in read_records(output)}
    path = trace_path(output)
    assert path == tmp_path / "rollout.trace.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == len(records) == 24
    for line in lines:
        record = records[(line["task_id"], line["sample"])]
        assert (line["format"], line["version"]) == (TRACE_FORMAT, TRACE_VERSION)
        assert line["group"] == record["task_id"]
        assert line["trajectory_id"] == record["trajectory_id"]
        steps = line["steps"]
        assert [s["turn"] for s in steps] == list(range(record["turns"]))
        # The steps' ids, joined, are the record's prompt and response exactly.
        assert steps[0]["input_token_ids"] == record["prompt_token_ids"]
        joined = [t for s in steps for t in s["input_token_ids"] + s["output_token_ids"]]
        assert joined == record["prompt_token_ids"] + record["response_token_ids"]
        assert [len(s["output_token_ids"]) for s in steps] == record["trace"]["turn_tokens"]
        assert [s["tool_s"] for s in steps[:-1]] == record["trace"]["tool_latency_s"]
        assert "tool_s" not in steps[-1]
        assert all(s["finish_reason"] in ("stop", "length") for s in steps)
        assert all(s["total_s"] >= s["engine_s"] >= 0 for s in steps)
        assert all(s["worker"] in {w.name for w in workers} for s in steps)

    bench = load_bench_workload(str(path), seed=0)
    assert bench.source == "trace" and len(bench.scripts) == 24
    by_key = {(s.group_id, s.sample): s for s in bench.scripts}
    for line in lines:
        script = by_key[(line["group"], line["sample"])]
        assert script.step_token_ids == tuple(tuple(s["output_token_ids"]) for s in line["steps"])
        assert script.prompt_tokens == len(line["steps"][0]["input_token_ids"])
        assert script.tool_output_tokens == tuple(
            len(s["input_token_ids"]) for s in line["steps"][1:]
        )

    cluster = load_cluster("2xcpu-tiny")
    sim = Simulator(bench.scripts, cluster, get_policy("heddle"), tool_means_s=bench.tool_means_s)
    result = sim.run()
    assert result.tokens == sum(r["tokens"]["generated"] for r in records.values())
    for s in sim.sims.values():  # the simulator ran every trajectory with the trace's steps
        assert tuple(s.traj.turn_tokens) == tuple(len(x) for x in s.script.step_token_ids)

    # The predictor is scored on the trace as it is (cold: no earlier rollout given) and,
    # given the trace as history, seeded from it.
    report = bench_predictor(workloads=(str(path),), steps=(1, 2), history=str(path))
    entry = report["workloads"][str(path)]
    assert (entry["trajectories"], entry["groups"]) == (24, 6)
    assert {"sibling/cold", "sibling/seeded", "progress/cold"} <= set(entry)
    multi = sum(1 for line in lines if len(line["steps"]) > 1)
    assert entry["share_with_more_steps_than"]["1"] == multi / 24
    assert entry["sibling/cold"][0]["alive"] == multi


def test_a_trace_of_another_version_is_refused_in_one_sentence(tmp_path: Path) -> None:
    steps = [{"input_token_ids": [1], "output_token_ids": [2]}]
    line = {"task_id": "a", "sample": 0, "format": TRACE_FORMAT, "version": 99, "group": "a",
            "status": "done", "steps": steps}  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(WorkloadError, match=r"t.jsonl line 1: heddle-trace version 99 is not"):
        load_bench_workload(str(path), seed=0)


def test_a_trace_step_without_its_tool_gap_is_named(tmp_path: Path) -> None:
    steps = [{"input_token_ids": [1, 2], "output_token_ids": [3]},
             {"input_token_ids": [4], "output_token_ids": [5]}]  # fmt: skip
    line = {"task_id": "a", "sample": 0, "format": TRACE_FORMAT, "version": TRACE_VERSION,
            "group": "a", "status": "done", "steps": steps}  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(WorkloadError, match="every step but the last needs 'tool_s'"):
        load_bench_workload(str(path), seed=0)


def test_chunking_cuts_steps_and_keeps_the_tool_gaps_between_them() -> None:
    script = TrajectoryScript(
        id="a", group_id="g", sample=0, prompt_tokens=5, turn_tokens=(70, 30),
        tool_names=("calc",), tool_latency_s=(0.5,), tool_output_tokens=(9,),
    )  # fmt: skip
    cut = chunked(script, 32)
    assert cut.turn_tokens == (32, 32, 6, 30)
    assert cut.tool_names == ("none", "none", "calc")
    assert cut.tool_latency_s == (0.0, 0.0, 0.5)
    assert cut.tool_output_tokens == (0, 0, 9)
    assert cut.total_tokens == script.total_tokens
