"""Weight-version age: how a trajectory's start version enters priority and placement.

Under asynchronous rollout (docs/async.md) weights change under running
trajectories. A trajectory's *age* is the number of versions pushed since its
first token's version. The simulator's ``heddle`` iteration policy and the live
session take two decisions from it, both here:

* **Priority, oldest first** (:class:`VersionAgedOrdering`). A trajectory
  ``age`` versions old ranks ahead of every younger one, whatever the ordering
  policy says; among equals the ordering policy decides. The oldest are the
  ones nearest the staleness bound: finished first, they train inside it
  instead of restarting, being dropped or holding the quota back, and the
  carried-over tail trains in the next batch, not never.
* **Placement after a load** (:func:`unpinned`). A weight load drops the
  engines' prefix caches (their KV came from the old weights), so a trajectory
  whose KV was computed under an older version than the one served now has
  nothing left to stay for: its next step is routed as a new trajectory's
  (the plan's instance, or the least loaded) instead of pinned to its old engine.
"""

from __future__ import annotations

from collections.abc import Callable

from ._ordering import OrderingPolicy
from ._types import Trajectory

__all__ = [
    "VERSION_AGE_STEP",
    "VersionAgedOrdering",
    "aged_priority",
    "kv_voided",
    "unpinned",
    "version_age",
]

# Priority units per version of age. Wider than any base rank (predicted tokens or
# seconds, both far below 1e8), so age decides first; and 21 versions still fit the
# signed 32-bit priority vLLM takes (engine_priority clamps beyond).
VERSION_AGE_STEP = 1e8


def version_age(started: int | None, now: int) -> int:
    """Versions pushed since ``started`` (the place of its first token's version) up to
    ``now``; 0 for a trajectory with no token yet, or whose version is unknown."""
    return 0 if started is None else max(0, now - started)


def aged_priority(base: float, age: int) -> float:
    """``base`` (lower runs first) moved ahead of every trajectory younger than ``age``."""
    return base - VERSION_AGE_STEP * age


class VersionAgedOrdering(OrderingPolicy):
    """``base``'s ordering, oldest weight version first (``age_of``: see :func:`version_age`)."""

    name = "version-aged"

    def __init__(self, base: OrderingPolicy, age_of: Callable[[Trajectory], int]) -> None:
        self.base = base
        self.age_of = age_of

    def priority(self, trajectory: Trajectory) -> float:
        return aged_priority(self.base.priority(trajectory), self.age_of(trajectory))


def kv_voided(kv_version: int | None, now: int) -> bool:
    """Whether a context's KV, computed under the version at place ``kv_version``, was
    dropped by a later load (``now``: the place of the version served now)."""
    return kv_version is not None and kv_version < now


def unpinned(instance: str | None, kv_version: int | None, now: int) -> str | None:
    """The instance a trajectory is pinned to for its next step: ``None`` (route it as
    new) when a load voided its KV there, else ``instance``."""
    return None if kv_voided(kv_version, now) else instance
