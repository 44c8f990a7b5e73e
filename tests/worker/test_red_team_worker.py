"""Issue 24, replayed against the worker: each finding as an attempt, and its refusal.

Whoever holds a pool's token may call its workers; these are what such a caller
(or a dead session) could do before, and what the worker answers now.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from heddle.worker import ResidentContexts, SimulatedEngine, job_of, trajectory_id
from heddle.worker._weights import MAX_CONFIG_BYTES, checkpoint_layout

from .conftest import sim_perf, worker
from .test_weights import fake_checkpoint


def sim() -> SimulatedEngine:
    return SimulatedEngine(sim_perf(), time_scale=0.01, max_model_len=4096)


@pytest.mark.anyio
async def test_weights_outside_the_roots_are_refused_alike_whether_they_exist_or_not(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ckpts"
    fake_checkpoint(root / "step-1")
    outside = fake_checkpoint(tmp_path / "elsewhere")  # exists, but not under the root
    async with worker(sim(), weights_roots=(str(root),)) as client:
        answers = {}
        for path in ("/etc", "/proc/self", f"{root}/../elsewhere", outside, "/no/such/dir"):
            reply = await client.post("/v1/weights", json={"path": path, "version": "x"})
            assert reply.status_code == 422, path
            answers[path] = reply.json()["error"].replace(path, "PATH")
        # One sentence for all: an existing directory and a missing one read the same.
        assert len(set(answers.values())) == 1, answers
        assert "is not under this worker's weights roots" in next(iter(answers.values()))
        ok = await client.post("/v1/weights", json={"path": str(root / "step-1"), "version": "1"})
        assert ok.status_code == 200, ok.text


@pytest.mark.anyio
async def test_a_worker_without_weights_roots_loads_nothing(tmp_path: Path) -> None:
    path = fake_checkpoint(tmp_path / "step-1")
    async with worker(sim()) as client:
        reply = await client.post("/v1/weights", json={"path": path, "version": "1"})
        assert reply.status_code == 422
        assert "it has none (heddle worker --weights-root DIR" in reply.json()["error"]


def test_an_oversized_config_json_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = Path(fake_checkpoint(tmp_path / "big"))
    (path / "config.json").write_text(json.dumps({"pad": "x" * MAX_CONFIG_BYTES}))
    with pytest.raises(Exception, match=r"config.json is over 1048576 bytes"):
        checkpoint_layout(str(path))


def test_resident_contexts_keep_the_cap_drop_the_idle_and_purge_a_job() -> None:
    now = [0.0]
    held = ResidentContexts(max_resident=3, ttl_s=10.0, clock=lambda: now[0])
    ids = [trajectory_id("job-a", i, 0) for i in range(4)]
    assert job_of(ids[0]) == "job-a" and job_of("job-a-t-x") is None
    for i, tid in enumerate(ids[:3]):
        now[0] = float(i)
        assert held.put(tid, [1, 2], busy=set()) == []
    held.get(ids[0])  # used again: the least recently used is now ids[1]
    assert held.put(ids[3], [3], busy={ids[1]}) == [ids[2]]  # a busy one is never dropped
    assert len(held) == 3 and held.dropped["cap"] == 1
    now[0] = 100.0
    assert sorted(held.expire(busy=set())) == sorted([ids[0], ids[1], ids[3]])
    other = trajectory_id("job-a-t", 0, 0)  # a job whose name looks like a prefix of ours
    held.put(trajectory_id("job-a", 9, 1), [1], busy=set())
    held.put(other, [1], busy=set())
    assert held.purge("job-a", busy=set()) == [trajectory_id("job-a", 9, 1)]
    assert other in held


@pytest.mark.anyio
async def test_imports_stop_at_the_cap_and_a_job_purge_empties_the_worker() -> None:
    """The probe of the finding (2,000 imports accepted): imports until and past the cap."""
    cap = 64
    async with worker(sim(), max_resident=cap, resident_ttl_s=600.0) as client:
        for i in range(cap + 36):
            tid = trajectory_id("probe", i, 0)
            reply = await client.put(f"/v1/trajectories/{tid}", json={"token_ids": [1] * 512})
            assert reply.status_code == 200
        state = (await client.get("/v1/state")).json()
        assert state["resident_trajectories"] == cap and state["max_resident"] == cap
        assert state["dropped_contexts"]["cap"] == 36 and state["resident_ttl_s"] == 600.0
        # The oldest went first; the session recomputes them on its next step (404).
        first = await client.get(f"/v1/trajectories/{trajectory_id('probe', 0, 0)}")
        assert first.status_code == 404
        metrics = (await client.get("/metrics")).text
        assert 'heddle_worker_dropped_contexts_total{reason="cap"} 36.0' in metrics
        assert f"heddle_worker_max_resident_trajectories {float(cap)}" in metrics
        purged = await client.delete("/v1/trajectories", params={"job": "probe"})
        assert purged.json() == {"job": "probe", "released": cap}
        assert (await client.get("/v1/state")).json()["resident_trajectories"] == 0


@pytest.mark.anyio
async def test_idle_contexts_expire_after_the_ttl() -> None:
    async with worker(sim(), resident_ttl_s=0.2) as client:
        tid = trajectory_id("idle", 0, 0)
        await client.put(f"/v1/trajectories/{tid}", json={"token_ids": [1, 2, 3]})
        assert (await client.get(f"/v1/trajectories/{tid}")).status_code == 200
        await asyncio.sleep(0.3)
        await client.get("/metrics")  # a scrape sweeps too
        assert (await client.get("/v1/state")).json()["dropped_contexts"]["ttl"] == 1
        assert (await client.get(f"/v1/trajectories/{tid}")).status_code == 404
