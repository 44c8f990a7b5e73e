"""Rollouts on real vLLM workers (CPU build, a generated tiny model): the synthetic example
(a long-tailed multi-turn load), a worker killed mid-run, and a session stopped and started
again. The quickstart on the real model: test_real_model.py.

Skipped only when vLLM is not installed; `.ci/run` installs it, so CI runs these.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.api import SamplingSpec, ToolEndpointSpec, ToolsSpec
from heddle.rollout import LocalPool, RolloutSession, SessionResult, Task, ToolsEnvironment
from heddle.scheduler import TrajectoryState
from heddle.worker import WorkerEndpoint

from .._rollout_fixtures import (
    ToolServer,
    assert_consistent,
    assert_exactly_once,
    read_records,
    start_pool,
)
from .._vllm import require_vllm
from .test_session import _keys, _session, _synthetic, stop_after

pytestmark = pytest.mark.slow  # real processes or engines; `-m 'not slow'` skips them

require_vllm()

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "examples" / "synthetic"


def test_synthetic_example_on_the_tiny_model(tmp_path: Path) -> None:
    output = tmp_path / "rollout.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "heddle",
            "run",
            str(QUICK / "job.yaml"),
            "--pool",
            str(QUICK / "pool.yaml"),
            "--output",
            str(output),
            "--plot",
            "--quiet",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / ".heddle" / "models" / "tiny" / "config.json").exists()
    records = read_records(output)
    assert_exactly_once(records, {(f"p{i:05d}", s) for i in range(16) for s in range(4)})
    for record in records:
        assert_consistent(record)
        assert record["status"] == "done"
    multi = [r for r in records if r["turns"] > 1]
    assert multi and all(0 in r["response_mask"] for r in multi)  # tool tokens masked out
    assert output.with_suffix(".png").stat().st_size > 10_000
    assert "64 done, 0 failed of 64 trajectories" in proc.stdout


@pytest.fixture(scope="module")
def vllm_pool(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalPool, list[WorkerEndpoint]]]:
    """Two single-core vLLM workers on the tiny model."""
    from heddle.worker._tiny_model import write_tiny_model

    tmp = tmp_path_factory.mktemp("vllm-pool")
    model = write_tiny_model(tmp / "model")
    pool, workers = start_pool([1, 1], tmp, engine="vllm", model=str(model), max_model_len=4096)
    try:
        yield pool, workers
    finally:
        asyncio.run(pool.stop())


def _holds_context(session: RolloutSession, worker: WorkerEndpoint) -> bool:
    return any(
        r.resident == worker.name and r.tokens and r.traj.state is TrajectoryState.IN_TOOL
        for r in session.runs.values()
    )


def test_session_restart_then_worker_death_lose_nothing(
    vllm_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    pool, workers = vllm_pool
    tasks, env = _synthetic(8, 4, tool_scale=1.0)
    out = tmp_path / "out.jsonl"

    # The session stops; the workers keep stale contexts of the unfinished trajectories.
    asyncio.run(stop_after(_session(workers, out, tasks, env, 4), out, 6))
    before = len(read_records(out))
    _, env2 = _synthetic(8, 4, tool_scale=1.0)

    async def second() -> tuple[RolloutSession, SessionResult]:
        session = _session(workers, out, tasks, env2, 4)
        run = asyncio.create_task(session.run())
        # Kill the worker only while it holds a context the session must rebuild elsewhere:
        # a trajectory past its first step, in a tool call, resident there (a kill that finds
        # only first steps or finishing ones would recompute nothing).
        while len(read_records(out)) < before + 4 or not _holds_context(session, workers[0]):
            assert not run.done(), "the session ended before the worker held a context to lose"
            await asyncio.sleep(0.01)
        pool.kill(workers[0].name)
        return session, await run

    _, result = asyncio.run(second())
    records = read_records(out)
    assert_exactly_once(records, _keys(tasks, 4))
    assert result.progress.resumed == before
    assert result.worker_failures >= 1
    assert all(r["status"] == "done" for r in records)
    recomputed = [r for r in records if r["placement"]["recomputes"] > 0]
    assert recomputed
    for r in records:
        assert_consistent(r)


def test_a_tools_job_shows_the_model_its_tools_through_the_chat_template(
    vllm_pool: tuple[LocalPool, list[WorkerEndpoint]], tool_server: ToolServer, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    pool, all_workers = vllm_pool
    # The module's pool may have lost a worker to an earlier test (it kills one on purpose).
    workers = [w for w in all_workers if pool.procs[w.name].process.poll() is None]
    assert workers, "no worker of the module's pool is alive"
    bearer = {"Authorization": f"Bearer {workers[0].token}"}  # the pool's per-run token
    model = httpx.get(f"{workers[0].url}/v1/state", headers=bearer, timeout=10).json()["model"]
    tokenizer = AutoTokenizer.from_pretrained(model)

    def calc(description: str) -> dict[str, Any]:
        parameters = {"type": "object", "properties": {"x": {"type": "integer"}}}
        function = {"name": "calc", "description": description, "parameters": parameters}
        return {"type": "function", "function": function}

    job_tools, own_tools = (calc("the job's calculator"),), (calc("this task's calculator"),)
    endpoint = ToolEndpointSpec("calc", tool_server.url + "/ok", timeout_s=2.0, retries=0)
    env = ToolsEnvironment(ToolsSpec(endpoints=(endpoint,), schemas=job_tools))
    question = ({"role": "user", "content": "add 2 and 2"},)
    tasks = [Task("job", question), Task("own", question, tools=own_tools)]
    out = tmp_path / "out.jsonl"
    sampling = SamplingSpec(max_tokens_per_turn=8, max_total_tokens=32)
    asyncio.run(_session(workers, out, tasks, env, 1, sampling=sampling).run())
    records = {r["task_id"]: r for r in read_records(out)}
    for task_id, tools in (("job", job_tools), ("own", own_tools)):
        expected = tokenizer.apply_chat_template(
            list(question), tools=list(tools), tokenize=False, add_generation_prompt=True
        )
        prompt = tokenizer.decode(records[task_id]["prompt_token_ids"])
        assert prompt == expected, task_id
        assert tools[0]["function"]["description"] in prompt
        assert_consistent(records[task_id])
