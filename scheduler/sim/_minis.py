"""The start-up decisions' mini-simulations, run in waves, and what a wave costs.

Heddle decides a run's shape and routing (the shape planner's replicas) and whether
GRPO groups are kept whole (the co-location verdict) by simulating the workload
sketch before it routes a step. The simulations of one question do not depend on
each other (each candidate shape and cap; the verdict's scattered and co-located
runs), so each question is one *wave*: a ``MiniRunner`` (sim/_simulator.py) runs a
wave's ``MiniRun`` s, inline (``InlineRunner``, the simulator's benchmarks) or on
several processes (the live session's, rollout/_decisions.py). The answers are the
same either way; only the time to them differs, and the simulator charges that
time from the events each run handled (:func:`wave_events`, ``PlannerCost``). This
module is what both sides share: how many processes a wave runs on, and its time.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DECISION_WORKERS",
    "MIN_PARALLEL_TRAJECTORIES",
    "Wave",
    "wave_events",
    "wave_workers",
]

# Processes a session runs its decisions' simulations on (at most; one per run of a
# wave). The session pod asks for as many CPUs (operator/_session_builders.py); a
# local ``heddle run`` uses no more than the machine has.
DECISION_WORKERS: Final = 4
# A wave runs inline when its simulations are smaller than this: a worker process
# costs about 0.3 s to start (Python, numpy, this package), more than a run this
# small takes.
MIN_PARALLEL_TRAJECTORIES: Final = 512


@dataclass(frozen=True)
class Wave:
    """One wave as it ran: the events each of its simulations handled, in order, and
    the processes they ran on (1: inline)."""

    events: tuple[int, ...]
    workers: int = 1


def wave_workers(trajectories: Sequence[int], workers: int) -> int:
    """The processes a wave of runs of so many ``trajectories`` each runs on with
    ``workers`` available: one per run, or 1 where the runs are too small to pay a
    worker's start."""
    if workers <= 1 or len(trajectories) <= 1 or min(trajectories) < MIN_PARALLEL_TRAJECTORIES:
        return 1
    return min(workers, len(trajectories))


def wave_events(wave: Wave) -> int:
    """The events on a wave's longest worker: runs taken in order, each by the first
    worker free (a process pool's queue). Per event the runs cost about the same, so
    this is the wave's time in events."""
    if wave.workers <= 1:
        return sum(wave.events)
    free = [0] * min(wave.workers, len(wave.events))
    for events in wave.events:
        heapq.heappush(free, heapq.heappop(free) + events)
    return max(free)
