"""Resident trajectory contexts, bounded: a cap on how many, an idle time-to-live, a purge
per job (docs/worker-api.md, "Resident contexts").

A context is a cache of what the session already holds (the session owns every
trajectory's token history), so dropping one costs a recompute, never a
trajectory: the next step gets 404 and the session sends the whole context
again. Without bounds a worker kept every context it was ever given until it
restarted, a dead session's included, and anyone with the pool's token could
fill its memory with imports.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_MAX_RESIDENT",
    "DEFAULT_RESIDENT_TTL_S",
    "ResidentContexts",
    "job_of",
    "trajectory_id",
]

DEFAULT_MAX_RESIDENT = 4096  # contexts per worker; about 8 per running sequence at batch 512
DEFAULT_RESIDENT_TTL_S = 1800.0  # idle this long (no step, import or export): dropped
_ID = re.compile(r"^(?P<job>.+)-t\d{6,}-s\d{3,}$")


def trajectory_id(job: str, task_index: int, sample: int) -> str:
    """The id a session gives a trajectory of ``job`` (the worker purges a job's by it)."""
    return f"{job}-t{task_index:06d}-s{sample:03d}"


def job_of(trajectory: str) -> str | None:
    """The job whose session named ``trajectory``, or None for an id of another shape."""
    match = _ID.match(trajectory)
    return match.group("job") if match else None


@dataclass
class ResidentContexts:
    """Token ids by trajectory, least recently used first; ``busy`` ones are never dropped."""

    max_resident: int = DEFAULT_MAX_RESIDENT
    ttl_s: float = DEFAULT_RESIDENT_TTL_S
    clock: Callable[[], float] = time.monotonic
    _held: dict[str, tuple[list[int], float]] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=lambda: {"cap": 0, "ttl": 0, "purge": 0})

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, trajectory: object) -> bool:
        return trajectory in self._held

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._held))

    def get(self, trajectory: str) -> list[int] | None:
        held = self._held.pop(trajectory, None)
        if held is None:
            return None
        self._held[trajectory] = (held[0], self.clock())  # most recently used: last
        return held[0]

    def put(self, trajectory: str, context: list[int], busy: set[str]) -> list[str]:
        """Hold ``context``; the ids dropped to stay within the cap and the TTL."""
        self._held.pop(trajectory, None)
        self._held[trajectory] = (context, self.clock())
        return self.expire(busy) + self._over_cap(busy | {trajectory})

    def pop(self, trajectory: str) -> list[int] | None:
        held = self._held.pop(trajectory, None)
        return None if held is None else held[0]

    def expire(self, busy: set[str]) -> list[str]:
        """Drop contexts idle longer than the TTL (oldest first: stops at the first fresh one)."""
        cutoff = self.clock() - self.ttl_s
        gone = []
        for trajectory, (_, used) in list(self._held.items()):
            if used > cutoff:
                break
            if trajectory not in busy:
                del self._held[trajectory]
                gone.append(trajectory)
        self.dropped["ttl"] += len(gone)
        return gone

    def _over_cap(self, busy: set[str]) -> list[str]:
        gone = []
        for trajectory in list(self._held):
            if len(self._held) <= self.max_resident:
                break
            if trajectory not in busy:
                del self._held[trajectory]
                gone.append(trajectory)
        self.dropped["cap"] += len(gone)
        return gone

    def purge(self, job: str, busy: set[str]) -> list[str]:
        """Drop every context of ``job`` (its session starts afresh or has ended)."""
        gone = [t for t in self._held if job_of(t) == job and t not in busy]
        for trajectory in gone:
            del self._held[trajectory]
        self.dropped["purge"] += len(gone)
        return gone
