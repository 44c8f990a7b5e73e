"""heddle.client on local workers: records streamed while the job runs, groups, progress."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from heddle.client import Rollout, RolloutProgress
from heddle.exceptions import CheckpointError, ConfigError

from .._rollout_fixtures import assert_exactly_once, read_records

pytestmark = [pytest.mark.slow]

QUICK = Path(__file__).resolve().parents[2] / "examples" / "synthetic"
KEYS = {(f"p{i:05d}", s) for i in range(16) for s in range(4)}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _job(output: Path, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "enginePool": "tiny",
        "samplesPerTask": 4,
        "environment": {
            "type": "synthetic",
            "synthetic": {"workload": str(QUICK / "workload.yaml"), "toolTimeScale": 0.5},
        },
        "output": {"path": str(output)},
    }
    return {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "client"},
        "spec": {**body, **spec},
    }


@pytest.mark.anyio
async def test_groups_stream_while_the_job_runs_each_record_once(tmp_path: Path) -> None:
    out = tmp_path / "out" / "rollout.jsonl"
    rollout = await Rollout.submit_local(
        _job(out), pool=QUICK / "pool.yaml", engine="sim", time_scale=0.1
    )
    seen: list[tuple[str, int]] = []
    phases_at_groups: list[str] = []
    dones: list[int] = []
    async for group in rollout.groups(poll_s=0.05):
        assert [r["sample"] for r in group.records] == [0, 1, 2, 3]
        assert {r["task_id"] for r in group.records} == {group.task_id}
        seen += [(r["task_id"], r["sample"]) for r in group.records]
        progress = await rollout.progress()
        phases_at_groups.append(progress.phase)
        dones.append(progress.done)
    assert len(seen) == len(set(seen)) == 64 and set(seen) == KEYS
    # The trainer had groups in hand while trajectories were still running.
    assert phases_at_groups[0] == "Running", phases_at_groups
    assert dones == sorted(dones) and dones[0] < 64, dones
    summary = await rollout.wait()
    assert summary["progress"]["done"] == 64
    tokens = summary["progress"]["tokens"]
    assert await rollout.progress() == RolloutProgress("Succeeded", 64, 64, 0, tokens)
    assert_exactly_once(read_records(out), KEYS)  # what was streamed is what the file holds


@pytest.mark.anyio
async def test_a_heddle_run_child_streams_records_and_its_summary(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    out = tmp_path / "out" / "rollout.jsonl"
    job.write_text(yaml.safe_dump(_job(Path("out/rollout.jsonl"), samplesPerTask=2)))
    rollout = await Rollout.submit_local(
        job, pool=QUICK / "pool.yaml", engine="sim", subprocess=True, time_scale=0.1
    )
    assert rollout.output == out
    keys = [(r["task_id"], r["sample"]) async for r in rollout.records(poll_s=0.05)]
    assert sorted(keys) == sorted({(f"p{i:05d}", s) for i in range(16) for s in range(2)})
    assert (await rollout.progress()).done == 32
    assert (await rollout.wait())["progress"]["done"] == 32


@pytest.mark.anyio
async def test_bad_input_is_one_sentence_before_any_worker_starts(tmp_path: Path) -> None:
    out = tmp_path / "rollout.jsonl"
    with pytest.raises(ConfigError, match=r"^engine 'gpu' is not one of vllm, sim$"):
        await Rollout.submit_local(_job(out), pool=QUICK / "pool.yaml", engine="gpu")
    with pytest.raises(ConfigError, match="samplesPerTask"):
        await Rollout.submit_local(
            _job(out, samplesPerTask=0), pool=QUICK / "pool.yaml", engine="sim"
        )
    with pytest.raises(ConfigError, match="subprocess=True runs `heddle run` on files"):
        await Rollout.submit_local(
            _job(out), pool=QUICK / "pool.yaml", engine="sim", subprocess=True
        )
    assert not out.exists()


@pytest.mark.anyio
async def test_a_checkpoint_that_does_not_load_fails_the_stream_in_one_sentence(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nope"
    rollout = await Rollout.submit_local(
        _job(tmp_path / "rollout.jsonl", weights={"path": str(missing), "version": 2}),
        pool=QUICK / "pool.yaml",
        engine="sim",
    )
    # The local run's own error comes through unchanged, after the records written before it.
    with pytest.raises(CheckpointError, match=f"checkpoint {missing} does not exist") as info:
        async for _ in rollout.records(poll_s=0.05):
            pass
    assert "\n" not in str(info.value)
    assert (await rollout.progress()).phase == "Failed"


def test_the_training_loop_example_runs_two_steps_on_two_weight_versions(tmp_path: Path) -> None:
    example = QUICK.parent / "training-loop" / "train.py"
    args = ["--engine", "sim", "--out", str(tmp_path), "--time-scale", "0.2"]
    command = [sys.executable, str(example), *args]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("step 1: 32 trajectories with weights version 1; ")
    assert lines[1].startswith("step 2: 32 trajectories with weights version 2; ")
    assert lines[2:] == [
        f"{tmp_path / 'step-1.jsonl'}: weight versions ['1']",
        f"{tmp_path / 'step-2.jsonl'}: weight versions ['2']",
    ]
    for step in (1, 2):
        records = read_records(tmp_path / f"step-{step}.jsonl")
        assert {r["weight_version"] for r in records} == {str(step)}
