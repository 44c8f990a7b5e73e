"""Ordering: progressive priority ranks by predicted remaining length; FCFS by readiness."""

from __future__ import annotations

from heddle.scheduler import (
    FCFSOrdering,
    ProgressivePriority,
    engine_priority,
    pick_preemption,
)

from ._trajectories import make


def test_progressive_priority_runs_the_longest_remaining_first_and_rereanks() -> None:
    policy = ProgressivePriority()
    a, b, c = make("a", 100), make("b", 5000), make("c", 900)
    order = sorted([a, b, c], key=policy.priority)
    assert [t.id for t in order] == ["b", "c", "a"]
    a.predicted_remaining_tokens = 9000  # a new prediction after a step
    assert sorted([a, b, c], key=policy.priority)[0] is a
    assert policy.preemptive


def test_fcfs_runs_steps_in_the_order_they_became_ready() -> None:
    policy = FCFSOrdering()
    early, late = make("early", 10, ready=1.0), make("late", 10_000, ready=2.0)
    assert sorted([late, early], key=policy.priority) == [early, late]
    assert not policy.preemptive


def test_preemption_evicts_the_lowest_priority_running_step_only_when_outranked() -> None:
    running = [-500.0, -40.0, -3000.0]  # priorities of running steps; -40 is the lowest
    assert pick_preemption(-100.0, running) == 1
    assert pick_preemption(-40.0, running) is None  # a tie does not preempt
    assert pick_preemption(-10.0, running) is None
    assert pick_preemption(-1.0, []) is None


def test_engine_priority_is_an_int_in_vllm_order_and_clamped() -> None:
    assert engine_priority(-1234.6) == -1235
    assert engine_priority(-1e30) == -(2**31 - 1)
    assert engine_priority(1e30) == 2**31 - 1
    assert engine_priority(-5000) < engine_priority(-100)  # longer remaining runs first
