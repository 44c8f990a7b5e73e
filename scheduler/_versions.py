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

The trainer's take follows from the same age (:func:`take_oldest`): of the finished
groups it has not taken, it takes those of the oldest version first, completion
order among equals. The simulator's ``heddle`` iteration policy and the live
session's ``GroupStream`` both decide with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ._ordering import OrderingPolicy
from ._types import Trajectory

__all__ = [
    "VERSION_AGE_STEP",
    "VersionAgedOrdering",
    "aged_priority",
    "kv_voided",
    "take_oldest",
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


def take_oldest(versions: Sequence[int], n: int) -> list[int]:
    """Which ``n`` finished groups a trainer takes, and in what order: oldest version first.

    ``versions`` holds, for each finished and untaken group in completion order, the place
    (in the order of pushes: lower is older) of the oldest weight version among its
    members' steps. Returns positions into ``versions`` in take order: the lowest place
    first, completion order among equals (a stable sort); all of them when ``n`` is larger.
    Why oldest first: those groups are the nearest the staleness bound, so trained now they
    train inside it, and a long group that finished late is not passed over for short
    fresh ones (that would bias the batch toward short outputs; docs/async.md).
    """
    return sorted(range(len(versions)), key=versions.__getitem__)[: max(0, n)]
