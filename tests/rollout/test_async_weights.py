"""New weights under a running rollout (docs/async.md): the session pushes them to every
worker, which finishes its steps, loads them in place and goes on; nothing is lost or
duplicated, and every record says, step by step, which version made which tokens.

The session runs on real ``heddle worker --engine sim`` processes over HTTP.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from heddle.api import WeightsSpec
from heddle.exceptions import ConfigError
from heddle.rollout import LocalPool
from heddle.worker import WorkerEndpoint

from .._rollout_fixtures import read_records
from ..worker.test_weights import fake_checkpoint
from .test_session import _session, _synthetic
from .test_weights import _versions


def test_weights_pushed_mid_rollout_change_later_steps_only(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    v1, v2, v3 = (WeightsSpec(fake_checkpoint(tmp_path / f"step-{n}"), str(n)) for n in (1, 2, 3))
    tasks, env = _synthetic(8, 4, tool_scale=0.5)  # multi-turn, with tool gaps
    out = tmp_path / "out.jsonl"
    session = _session(workers, out, tasks, env, 4, weights=v1)
    pushed_at: list[int] = []

    async def go() -> None:
        run = asyncio.create_task(session.run())
        for spec in (v2, v3):
            while session._steps < 40 * (len(pushed_at) + 1) and not run.done():
                await asyncio.sleep(0.02)
            pushed_at.append(session._steps)
            session.push_weights(spec)
        await run

    asyncio.run(go())
    records = read_records(out)
    # Nothing lost or duplicated: one record per (task, sample), every one finished.
    keys = [(r["task_id"], r["sample"]) for r in records]
    assert len(keys) == 32 and len(set(keys)) == 32
    assert {r["status"] for r in records} == {"done"}
    order = {"1": 1, "2": 2, "3": 3}
    crossed = 0
    for r in records:
        segments = r["segments"]
        assert len(segments) == r["turns"]
        versions = [order[s["weight_version"]] for s in segments]
        assert versions == sorted(versions), "a step ran on older weights than the one before"
        assert r["weight_version"] == segments[0]["weight_version"]
        assert r["weight_versions"] == sorted(set(r["weight_versions"]), key=order.__getitem__)
        # The segments tile the generated tokens exactly (tool tokens between them).
        mask = r["response_mask"]
        covered = [i for s in segments for i in range(s["response_start"], s["response_end"])]
        assert covered == [i for i, m in enumerate(mask) if m == 1]
        crossed += len(set(versions)) > 1
    assert crossed > 0, "no trajectory ran across a weight push"
    assert {s["weight_version"] for r in records for s in r["segments"]} == {"1", "2", "3"}
    assert _versions(workers) == ["3", "3"]


def test_pushing_weights_needs_a_job_with_weights(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    tasks, env = _synthetic(1, 1)
    session = _session(workers, tmp_path / "out.jsonl", tasks, env, 1)
    with pytest.raises(ConfigError, match=r"names no spec\.weights"):
        session.push_weights(WeightsSpec(str(tmp_path), "2"))
