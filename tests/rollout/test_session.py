"""The rollout session end to end on real worker processes (simulated engine) over HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.api import SamplingSpec, ToolEndpointSpec, ToolsSpec
from heddle.exceptions import HeddleError
from heddle.rollout import (
    Environment,
    LocalPool,
    OutputSink,
    RolloutSession,
    SessionConfig,
    SessionResult,
    SyntheticEnvironment,
    Task,
    ToolsEnvironment,
    load_workload,
    perf_model_for,  # noqa: F401 - keeps the public helper imported
    step_seed,
    synthetic_tasks,
)
from heddle.scheduler import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    SAMPLING_LIMITS,
    PerfModel,
    PredictorConfig,
)
from heddle.worker import WorkerEndpoint

from .._rollout_fixtures import ToolServer, assert_consistent, assert_exactly_once, read_records

# Starts sim worker processes for the module: not the inner loop (README).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = load_workload(str(ROOT / "examples" / "synthetic" / "workload.yaml"))
PERF = PerfModel(MODEL_PRESETS["qwen3-8b"], HARDWARE_PRESETS["h100-sxm"])
FAST = SessionConfig(replan_interval_s=0.3, health_interval_s=0.2, unhealthy_after=2)


def _synthetic(
    tasks: int, samples: int, tool_scale: float = 0.05
) -> tuple[list[Task], Environment]:
    return (
        synthetic_tasks(tasks, WORKLOAD, seed=0),
        SyntheticEnvironment(WORKLOAD, tasks, samples, seed=0, tool_time_scale=tool_scale),
    )


def _session(
    workers: list[WorkerEndpoint],
    output: Path,
    tasks: list[Task],
    env: Environment,
    samples: int,
    **kwargs: Any,
) -> RolloutSession:
    options: dict[str, Any] = {
        "job": "t",
        "tasks": tasks,
        "samples_per_task": samples,
        "environment": env,
        "workers": workers,
        "sink": OutputSink(output),
        "perf": PERF,
        "sampling": SamplingSpec(max_tokens_per_turn=2048, max_total_tokens=3000),
        "max_turns": 8,
        "config": FAST,
    }
    options.update(kwargs)
    return RolloutSession(**options)


async def stop_after(session: RolloutSession, out: Path, records: int) -> None:
    """Run ``session`` until ``out`` holds ``records`` records, then stop it like a kill would."""
    run = asyncio.create_task(session.run())
    while not out.exists() or len(read_records(out)) < records:
        await asyncio.sleep(0.02)
    run.cancel()  # unfinished trajectories are not written
    with pytest.raises(asyncio.CancelledError):
        await run


def _keys(tasks: list[Task], samples: int) -> set[tuple[str, int]]:
    return {(t.id, s) for t in tasks for s in range(samples)}


@pytest.mark.parametrize("policy", ["heddle", "verl", "slime"])
def test_synthetic_job_writes_every_trajectory_once(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path, policy: str
) -> None:
    _, workers = sim_pool
    tasks, env = _synthetic(8, 4)
    out = tmp_path / "out.jsonl"
    result = asyncio.run(_session(workers, out, tasks, env, 4, policy=policy).run())
    records = read_records(out)
    assert_exactly_once(records, _keys(tasks, 4))
    for record in records:
        assert_consistent(record)
        assert record["status"] == "done" and record["policy"] == policy
    scripts = {(s.group_id, s.sample): s for s in env.scripts}  # type: ignore[attr-defined]
    for r in records:  # each step generated exactly its scripted tokens
        script = scripts[(f"quickstart-p{int(r['task_id'][1:]):05d}", r["sample"])]
        assert r["tokens"]["generated"] == min(script.total_tokens, 3000)
        assert r["turns"] == script.turns or r["tokens"]["generated"] == 3000
    p = result.progress
    assert (p.done, p.failed, p.total, p.queued, p.generating, p.in_tool) == (32, 0, 32, 0, 0, 0)
    assert result.steps == sum(r["turns"] for r in records)


def test_worker_killed_mid_run_loses_nothing(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    pool, workers = sim_pool
    tasks, env = _synthetic(8, 4, tool_scale=0.5)
    out = tmp_path / "out.jsonl"

    async def go() -> SessionResult:
        session = _session(workers, out, tasks, env, 4)
        run = asyncio.create_task(session.run())
        while not out.exists() or len(read_records(out)) < 4:
            await asyncio.sleep(0.05)
        pool.kill(workers[0].name)
        return await run

    result = asyncio.run(go())
    records = read_records(out)
    assert_exactly_once(records, _keys(tasks, 4))
    assert all(r["status"] == "done" for r in records)
    assert result.worker_failures >= 1
    moved = [r for r in records if r["placement"]["recomputes"] > 0]
    assert moved, "no trajectory was recomputed on the surviving worker"
    for r in moved:
        assert_consistent(r)
        assert r["placement"]["steps"][-1] == workers[1].name


def test_restarted_session_resumes_without_duplicates(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    tasks, env = _synthetic(8, 4, tool_scale=0.5)
    out = tmp_path / "out.jsonl"

    asyncio.run(stop_after(_session(workers, out, tasks, env, 4), out, 6))
    first = len(read_records(out))
    assert 6 <= first < 32
    _, env2 = _synthetic(8, 4, tool_scale=0.5)
    result = asyncio.run(_session(workers, out, tasks, env2, 4).run())
    assert result.progress.resumed == first
    assert_exactly_once(read_records(out), _keys(tasks, 4))


def test_deadline_records_unfinished_trajectories_as_truncated(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    tasks, env = _synthetic(4, 2, tool_scale=20.0)  # tool calls of seconds: most cannot finish
    out = tmp_path / "out.jsonl"
    result = asyncio.run(_session(workers, out, tasks, env, 2, deadline_s=1.5).run())
    assert result.deadline_hit
    records = read_records(out)
    assert_exactly_once(records, _keys(tasks, 2))
    truncated = [r for r in records if r["status"] == "truncated"]
    assert truncated and all(r["finish_reason"] == "deadline" for r in truncated)
    assert all(len(r["response_mask"]) == len(r["response_token_ids"]) for r in records)


def _tool_task(task_id: str, *replies: str) -> Task:
    prompt = "solve it " + "".join(f"<reply>{r}</reply>" for r in replies)
    return Task(task_id, ({"role": "user", "content": prompt},))


def _call(name: str, **args: Any) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def test_tools_environment_runs_tool_calls_and_reports_failures(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tool_server: ToolServer, tmp_path: Path
) -> None:
    _, workers = scripted_pool
    endpoints = tuple(
        ToolEndpointSpec(name, tool_server.url + path, timeout_s=0.3, retries=1)
        for name, path in (("calc", "/ok"), ("junk", "/garbage"), ("flaky", "/flaky"))
    )
    tasks = [
        _tool_task("ok", "let me compute " + _call("calc", x=2), "the answer is 4"),
        _tool_task("garbage", _call("junk", q=1), "giving up"),
        _tool_task("unknown", _call("nope"), "hmm"),
        _tool_task("flaky", _call("flaky"), "done"),
        _tool_task("broken", "<tool_call>{broken</tool_call>", "sorry"),
    ]
    env = ToolsEnvironment(ToolsSpec(endpoints=endpoints, on_error="message"))
    out = tmp_path / "out.jsonl"
    asyncio.run(_session(workers, out, tasks, env, 1).run())
    records = {r["task_id"]: r for r in read_records(out)}
    assert set(records) == {t.id for t in tasks}
    ok = records["ok"]
    assert ok["status"] == "done" and ok["turns"] == 2 and ok["tool_calls"] == 1
    assert [m["role"] for m in ok["messages"]] == ["user", "assistant", "tool", "assistant"]
    # OpenAI's format: the call (parsed by the Hermes fallback: the sim has no vLLM parser)
    # on the assistant message, its id on the tool result.
    call = {"id": "call_0_0", "type": "function"}
    call["function"] = {"name": "calc", "arguments": '{"x": 2}'}
    assert ok["messages"][1] == {
        "role": "assistant",
        "content": "let me compute ",
        "tool_calls": [call],
    }
    assert ok["messages"][2]["tool_call_id"] == "call_0_0"
    assert ok["messages"][2]["content"] == 'calc says {"x": 2}'
    assert ok["messages"][3]["content"] == "the answer is 4"
    assert_consistent(ok)
    assert 0 in ok["response_mask"]  # the tool message's tokens are masked out
    for name, text in (
        ("garbage", 'is not JSON {"content": string}'),
        ("unknown", "unknown tool 'nope'"),
        ("broken", "not valid JSON"),
    ):
        r = records[name]
        assert r["status"] == "done" and r["tool_errors"] == 1, name
        assert r["messages"][2]["role"] == "tool" and text in r["messages"][2]["content"], name
    # /flaky fails twice per trajectory; one retry is not enough
    assert records["flaky"]["tool_errors"] == 1


def test_tool_failure_can_fail_the_trajectory(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tool_server: ToolServer, tmp_path: Path
) -> None:
    _, workers = scripted_pool
    endpoints = (
        ToolEndpointSpec("junk", tool_server.url + "/garbage", timeout_s=0.3, retries=2),
        ToolEndpointSpec("strict", tool_server.url + "/refuse", timeout_s=0.3, retries=2),
    )
    env = ToolsEnvironment(ToolsSpec(endpoints=endpoints, on_error="fail"))
    tasks = [
        _tool_task("a", _call("junk"), "never"),
        _tool_task("b", "no tools needed"),
        _tool_task("unknown", _call("nope"), "never"),  # onError: fail covers unknown tools
        _tool_task("refused", _call("strict"), "never"),  # ... and a 4xx
        _tool_task("broken", "<tool_call>{broken</tool_call>", "fixed it"),  # never fails it
    ]
    out = tmp_path / "out.jsonl"
    result = asyncio.run(_session(workers, out, tasks, env, 2).run())
    records = read_records(out)
    assert_exactly_once(records, _keys(tasks, 2))
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_task.setdefault(r["task_id"], []).append(r)
    for task_id, error in (
        ("a", "after 3 attempts"),
        ("unknown", "unknown tool 'nope'"),
        ("refused", "refused the call (400)"),
    ):
        assert all(r["status"] == "failed" and error in r["error"] for r in by_task[task_id])
    assert all(r["status"] == "done" for r in by_task["b"])
    assert all(r["status"] == "done" and r["tool_errors"] == 1 for r in by_task["broken"])
    assert result.progress.failed == 6
    assert len([c for c in tool_server.calls if c[0] == "/garbage"]) == 2 * 3
    assert len([c for c in tool_server.calls if c[0] == "/refuse"]) == 2


def _generate_requests(workers: list[WorkerEndpoint], status: int) -> int:
    """Generate requests the workers answered with ``status``, from their own /metrics."""
    route = 'route="POST /v1/trajectories/{trajectory_id}/generate"'
    total = 0.0
    for w in workers:
        for line in httpx.get(f"{w.url}/metrics", timeout=5).text.splitlines():
            ours = line.startswith("heddle_worker_requests_total{") and route in line
            if ours and f'status="{status}"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return int(total)


def test_rejected_step_fails_its_trajectory_once_and_the_rest_go_on(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = scripted_pool
    env = ToolsEnvironment(ToolsSpec())
    bad = Task("bad", ({"role": "narrator", "content": "once upon a time"},))  # the worker: 422
    tasks = [_tool_task("a", "fine"), bad, _tool_task("b", "also fine")]
    out = tmp_path / "out.jsonl"
    result = asyncio.run(_session(workers, out, tasks, env, 2).run())
    records = read_records(out)
    assert_exactly_once(records, _keys(tasks, 2))
    for r in records:
        if r["task_id"] == "bad":
            assert r["status"] == "failed" and "422 invalid request" in r["error"], r["error"]
            assert "role" in r["error"]
        else:
            assert r["status"] == "done"
    assert result.progress.failed == 2
    assert _generate_requests(workers, 422) == 2  # each rejected once, never sent again


def test_job_whose_steps_are_all_rejected_stops_early_with_the_error(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    tasks, env = _synthetic(100, 1)
    # Built directly, past the manifest's ranges: the workers refuse it (422) on every step.
    sampling = SamplingSpec(temperature=-1.0, max_tokens_per_turn=256, max_total_tokens=3000)
    config = dataclasses.replace(FAST, max_inflight_per_worker=2)
    out = tmp_path / "out.jsonl"
    session = _session(workers, out, tasks, env, 1, sampling=sampling, config=config)
    refused_before = _generate_requests(workers, 422)  # the workers may have served other tests
    with pytest.raises(HeddleError) as err:
        asyncio.run(session.run())
    message = str(err.value)
    assert "the first 8 trajectories to finish were all rejected by the workers" in message
    assert "422 invalid request: sampling.temperature" in message
    records = read_records(out)
    assert 8 <= len(records) < 40, "it ground on instead of stopping"
    assert all(r["status"] == "failed" and "422" in r["error"] for r in records)
    assert len({(r["task_id"], r["sample"]) for r in records}) == len(records)
    # Stopped early: steps answered while the session stopped are not recorded (they run
    # again next time), but far fewer than the 100 a grinding job would have sent.
    assert len(records) <= _generate_requests(workers, 422) - refused_before < 40


def test_step_failing_on_a_ready_worker_backs_off_then_fails_its_trajectory(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    tasks, env = _synthetic(2, 1)
    # Every step outlasts its timeout while /readyz answers: the same step fails again and again.
    config = dataclasses.replace(FAST, step_timeout_s=0.01, retry_backoff_s=0.2, max_step_retries=2)
    out = tmp_path / "out.jsonl"
    answered_before = _generate_requests(workers, 200)  # the workers may have served other tests
    started = time.monotonic()
    session = _session(workers, out, tasks, env, 1, config=config, deadline_s=30.0)
    result = asyncio.run(session.run())
    elapsed = time.monotonic() - started
    records = read_records(out)
    assert_exactly_once(records, _keys(tasks, 1))
    for r in records:
        assert r["status"] == "failed", r["status"]
        assert "the step failed 3 times on workers that stayed ready" in r["error"]
        assert "no answer in 0.01 s" in r["error"]
    assert not result.deadline_hit
    assert elapsed >= 0.2 + 0.4  # waited between attempts: 0.2 s, then twice that
    assert _generate_requests(workers, 200) - answered_before <= 2 * 3  # no hot loop of attempts


def test_step_seeds_derive_from_the_jobs_and_stay_valid() -> None:
    assert step_seed(7, 2, 1, 3) == 7 + 2 * 1009 + 7 + 3
    top = SAMPLING_LIMITS.seed_max  # the largest seed the manifest accepts
    seeds = {step_seed(top, t, s, turn) for t in range(50) for s in range(4) for turn in range(3)}
    assert len(seeds) == 50 * 4 * 3 and all(0 <= x <= top for x in seeds)


def test_a_worker_joining_while_the_session_shuts_down_is_not_connected(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    """The operator adds workers concurrently; one that joins at the end opens nothing."""
    _, workers = sim_pool
    tasks, env = _synthetic(2, 2)
    session = _session(workers[:1], tmp_path / "out.jsonl", tasks, env, 2)
    closing = env.close

    async def close_and_join() -> None:
        session.add_worker(workers[1])  # as _sync_workers may, mid-shutdown
        await closing()

    env.close = close_and_join  # type: ignore[method-assign]
    result = asyncio.run(session.run())
    assert result.progress.done == 4
    assert session._pools == {}  # every connection closed, none opened for the late worker


def test_in_flight_cap_bounds_started_unfinished_trajectories(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    # The shape planner's fallback runs verl with an in-flight cap; the session keeps it.
    _, workers = sim_pool
    tasks, env = _synthetic(4, 4)
    out = tmp_path / "out.jsonl"
    session = _session(workers, out, tasks, env, 4, policy="verl", max_trajectories_in_flight=3)
    inner = session._trajectory
    live, peak = 0, 0

    async def counted(run: Any) -> None:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        try:
            await inner(run)
        finally:
            live -= 1

    session._trajectory = counted  # type: ignore[method-assign]
    asyncio.run(session.run())
    assert_exactly_once(read_records(out), _keys(tasks, 4))
    assert peak == 3
    with pytest.raises(HeddleError, match="max_trajectories_in_flight=0"):
        _session(workers, out, tasks, env, 4, max_trajectories_in_flight=0)


def test_a_written_trajectory_keeps_no_history(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    """A long job's finished trajectories would otherwise hold every token until it ends."""
    _, workers = sim_pool
    tasks, env = _synthetic(2, 2)
    out = tmp_path / "out.jsonl"
    session = _session(workers, out, tasks, env, 2)
    asyncio.run(session.run())
    assert all(r["response_token_ids"] for r in read_records(out))
    for run in session.runs.values():
        assert (len(run.tokens), len(run.mask), run.messages) == (0, 0, [])


def test_a_worker_that_refuses_the_token_is_left_out_and_the_job_completes(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    """401 is the worker's verdict on the token, not on the step: the steps go elsewhere,
    and its open /readyz does not bring it back (a pod made before a new Secret)."""
    _, (good, stale) = sim_pool
    stale = dataclasses.replace(stale, token="the-old-token")
    tasks, env = _synthetic(6, 4)
    out = tmp_path / "out.jsonl"
    session = _session([good, stale], out, tasks, env, 4)

    def refused_so_far() -> float:  # the workers may have served other tests: count the change
        metrics = httpx.get(f"{stale.url}/metrics", timeout=5).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("heddle_worker_requests_total") and 'status="401"' in line
        )

    refused_before = refused_so_far()
    result = asyncio.run(session.run())
    assert (result.progress.done, result.progress.failed) == (24, 0)
    assert_exactly_once(read_records(out), _keys(tasks, 4))
    assert {w for r in read_records(out) for w in r["placement"]["steps"]} == {good.name}
    refused = refused_so_far() - refused_before
    # Only steps already sent there are refused, each trajectory's at most once (12 seen);
    # then none goes there. Before the worker was kept down, its open /readyz let steps
    # back and the same trajectories were refused again (31-33 seen).
    assert 0 < refused <= 24


def test_the_sessions_predictor_takes_its_priors_from_the_jobs_budget(tmp_path: Path) -> None:
    tasks, env = _synthetic(2, 2)
    endpoint = WorkerEndpoint("w", "http://127.0.0.1:1", 1, "token")
    session = _session([endpoint], tmp_path / "out.jsonl", tasks, env, 2)
    assert session.predictor is not None
    assert session.predictor.config == PredictorConfig.for_budget(3000)  # type: ignore[attr-defined]
