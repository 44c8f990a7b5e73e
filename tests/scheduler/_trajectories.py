"""A trajectory with a given predicted remaining length: what the orderings rank."""

from __future__ import annotations

from heddle.scheduler import Trajectory


def make(tid: str, remaining: float, ready: float = 0.0) -> Trajectory:
    t = Trajectory(tid, "g", 10, ready_s=ready)
    t.predicted_remaining_tokens = remaining
    return t
