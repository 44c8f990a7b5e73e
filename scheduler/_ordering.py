"""Ordering policies: which ready step runs first on an engine.

A priority is a float where lower runs first, the convention of vLLM's
``scheduling_policy="priority"``; :func:`engine_priority` turns it into the
integer the worker hands to vLLM.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from ._types import Trajectory

__all__ = [
    "FCFSOrdering",
    "OrderingPolicy",
    "ProgressivePriority",
    "engine_priority",
    "pick_preemption",
]

_INT32 = 2**31 - 1


class OrderingPolicy(ABC):
    """Ranks trajectories waiting for an engine. Lower :meth:`priority` runs first."""

    name: ClassVar[str]
    preemptive: ClassVar[bool] = False  # may a waiting step evict a running one?

    @abstractmethod
    def priority(self, trajectory: Trajectory) -> float:
        """The trajectory's rank now; recomputed whenever its prediction changes."""


class ProgressivePriority(OrderingPolicy):
    """Heddle: longest predicted *remaining* length first (a dynamic LPT).

    Re-ranked after every step and tool result, as predictions sharpen. The
    paper also lets a waiting step that outranks the lowest-ranked running
    step evict it (:func:`pick_preemption`); vLLM's scheduler admits by
    priority but never evicts a running step for a waiting one, so neither
    the worker nor the simulator applies that rule (docs/simulator.md).
    """

    name = "progressive"
    preemptive = True

    def priority(self, trajectory: Trajectory) -> float:
        return -trajectory.predicted_remaining_tokens


class FCFSOrdering(OrderingPolicy):
    """Step-centric baselines: steps run in the order they became ready."""

    name = "fcfs"

    def priority(self, trajectory: Trajectory) -> float:
        return trajectory.ready_s


def engine_priority(value: float) -> int:
    """Integer priority for vLLM (lower first), clamped to a signed 32-bit range."""
    return max(-_INT32, min(_INT32, round(value)))


def pick_preemption(waiting_head: float, running: Sequence[float]) -> int | None:
    """The paper's rule: index of the running step to evict, or ``None``.

    When the head of the waiting queue outranks the lowest-priority running
    step (strictly: a larger value is a lower priority), that step is evicted.
    """
    if not running:
        return None
    worst = max(range(len(running)), key=running.__getitem__)
    return worst if waiting_head < running[worst] else None
