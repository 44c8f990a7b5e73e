"""The start-up decisions' simulations on worker processes give the inline answers.

A wave of the co-location verdict's kind (one workload sketch under verl's routing,
scattered and kept whole) runs on real spawned processes and in this process; the
makespans and events must be identical, since only where they run differs.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from heddle.rollout import (
    CPUS_ENV,
    ProcessRunner,
    _decisions,
    decide_run,
    load_cluster,
    load_workload,
    perf_model_for,
    prepare_job,
    usable_cpus,
)
from heddle.scheduler import (
    HEDDLE_SPECULATION,
    PoolShape,
    acceptance_model,
    generate,
    get_policy,
    history_of,
)
from heddle.scheduler.sim import InlineRunner, MiniRun, SimConfig, _minis, heddle_speculation

# A small synthetic coding job (stands in for a workload sketch) on one 4-GPU node.
_CODING = replace(load_workload("coding"), prompts=4, samples_per_prompt=4)
_NODE = replace(load_cluster("64xh100"), gpus=4)


def _wave() -> list[MiniRun]:
    scripts = generate(_CODING, 3)
    # As the verdict's runs are: they decide nothing themselves and are charged nothing.
    spec = heddle_speculation(HEDDLE_SPECULATION, acceptance_model("default"))
    config = SimConfig(planner_cost=None, speculation=replace(spec, colocate_groups=False))
    return [
        MiniRun(
            scripts, _NODE, get_policy("verl"), {"tool": 0.3}, history_of(generate(_CODING, 4)),
            PoolShape.of({4: 1}), _NODE.perf_model(), config, keep_groups=keep,
        )
        for keep in (False, True)
    ]  # fmt: skip


@pytest.fixture
def every_wave_pays_for_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs this small counted as worth a worker process each (the threshold is for
    the session's real sketches), on a host with two CPUs to give them (on one, the
    two processes share it: only slower)."""
    monkeypatch.setattr(_minis, "MIN_PARALLEL_TRAJECTORIES", 1)
    monkeypatch.setattr(_decisions, "usable_cpus", lambda: 2)


@pytest.mark.usefixtures("every_wave_pays_for_workers")
def test_worker_processes_give_the_inline_answers() -> None:
    runs = _wave()
    inline, alone = InlineRunner().run_wave(runs)
    with ProcessRunner(2) as runner:
        assert runner.workers == 2
        spawned, beside = runner.run_wave(runs)
    assert spawned == inline
    assert beside.events == alone.events and all(e > 0 for e in beside.events)
    assert (beside.workers, alone.workers) == (2, 1)
    assert runner.used == 2


@pytest.mark.usefixtures("every_wave_pays_for_workers")
def test_workers_that_cannot_start_leave_the_simulations_inline(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_processes(self: ProcessRunner) -> None:
        raise OSError(38, "Function not implemented")  # no /dev/shm for its semaphores

    monkeypatch.setattr(ProcessRunner, "_started", no_processes)
    runs = _wave()
    with ProcessRunner(2) as runner, caplog.at_level(logging.WARNING, "heddle.run"):
        assert runner.workers == 2
        first, wave = runner.run_wave(runs)
        again, _ = runner.run_wave(runs)
    assert first == again == InlineRunner().run_wave(runs)[0]
    assert wave.workers == 1 and runner.used == 1  # charged as what it was: one process
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "worker processes failed" in warned[0]


def test_a_runner_never_asks_for_more_processes_than_cpus() -> None:
    assert ProcessRunner(10_000).workers == usable_cpus()
    assert ProcessRunner(1).workers == 1


def test_the_cpus_a_pod_asked_for_bound_the_processes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A session pod that asked for one CPU sees all of its node's cores; the operator
    # passes its request (HEDDLE_CPUS), and a CPU limit shows as the cgroup's quota.
    monkeypatch.setattr(_decisions.os, "sched_getaffinity", lambda _pid: set(range(16)))
    no_cgroup = tmp_path / "absent"
    monkeypatch.delenv(CPUS_ENV, raising=False)
    assert usable_cpus(no_cgroup) == 16
    monkeypatch.setenv(CPUS_ENV, "1")
    assert usable_cpus(no_cgroup) == 1
    monkeypatch.setattr(_decisions, "CGROUP_CPU_MAX", no_cgroup)
    assert ProcessRunner().workers == 1  # the decisions run in the session's process
    for unset in ("0", "", "lots"):  # no request, or nothing a number: no bound from it
        monkeypatch.setenv(CPUS_ENV, unset)
        assert usable_cpus(no_cgroup) == 16
    monkeypatch.setenv(CPUS_ENV, "3")
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("250000 100000\n")  # a limit of 2.5 CPUs, rounded up
    assert usable_cpus(cpu_max) == 3
    cpu_max.write_text("150000 100000\n")
    assert usable_cpus(cpu_max) == 2
    cpu_max.write_text("max 100000\n")  # no limit
    assert usable_cpus(cpu_max) == 3


def test_a_run_says_how_long_deciding_took_and_where(caplog: pytest.LogCaptureFixture) -> None:
    # The synthetic example: 64 trajectories, too few for a worker process to pay.
    example = Path(__file__).parents[2] / "examples" / "synthetic"
    local = prepare_job(example / "job.yaml", example / "pool.yaml")
    with caplog.at_level(logging.INFO, "heddle.run"):
        decided = decide_run(local, perf_model_for(local.pool))
    plan, colocation, took = decided.plan, decided.colocation, decided.took_s
    assert plan.shape == local.pool.shape and colocation is None  # pinned; no speculation
    (said,) = [r.getMessage() for r in caplog.records if "decided in" in r.getMessage()]
    assert said.startswith("synthetic: shape 2xTP1 and co-location decided in")
    assert said.endswith("s (on the session's process)") and took >= 0.0
