"""Presorted dynamic programming: contiguous placement of sorted trajectories.

Trajectories sorted by predicted remaining length (longest first) are cut into
contiguous groups, one per engine instance, minimising the predicted makespan

    D(i, j) = min_k max(D(k, j-1), cost_j(k..i-1))
    cost_j(g) = T_j * max(F_j(min(|g|, cap_j)) * max L(g),  F_j(cap_j) * sum L(g) / cap_j)

(the paper's cost), where ``F`` grows linearly past the engine's batch cap
because a group larger than the cap takes turns.

For a given instance order the result is the exact optimum over contiguous
partitions. Some instance order's contiguous optimum is optimal over *all*
assignments (exchange argument: order any solution's groups by their longest
member and repack them contiguously with the same sizes and instances; no
group's longest member grows). :func:`heddle.scheduler.solve_lengths` tries
every order for up to five instances and class orders beyond;
tests/scheduler/test_dp.py checks both claims by brute force.

``D(k, j-1)`` is nondecreasing in ``k`` and ``cost_j(k..i-1)`` nonincreasing,
so the inner minimum sits where the two cross: a binary search, vectorised
over all ``i`` at once. That gives O(m · n · log n) instead of the paper's
O(n² m) with the same (exact) optimum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from heddle.exceptions import ConfigError

from ._perf import EngineInstance

__all__ = ["Items", "aggregate", "group_cost", "search_contiguous", "solve_contiguous"]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class Items:
    """Trajectories (or aggregates of short ones) sorted longest first.

    ``longest[i]`` is the item's largest predicted length, ``count[i]`` how
    many trajectories it holds, ``work[i]`` their summed length, and
    ``members[i]:members[i+1]`` their positions in the sorted input.
    """

    longest: FloatArray
    count: IntArray
    work: FloatArray
    members: IntArray

    def __len__(self) -> int:
        return len(self.longest)


def aggregate(sorted_lengths: FloatArray, max_items: int) -> Items:
    """Bound the DP's size: keep long trajectories exact and bucket the short tail.

    The longest half of ``max_items`` stay single; the rest of the input is cut
    into equal contiguous buckets. Buckets preserve contiguity, so a bucket's
    cost is exactly the cost of its members placed together.
    """
    n = len(sorted_lengths)
    if max_items < 2:
        raise ConfigError(f"max_items={max_items} must be at least 2")
    if n <= max_items:
        bounds = np.arange(n + 1, dtype=np.int64)
    else:
        exact = max_items // 2
        buckets = max_items - exact
        tail = np.linspace(exact, n, buckets + 1).round().astype(np.int64)
        bounds = np.unique(np.concatenate([np.arange(exact, dtype=np.int64), tail]))
    cumulative = np.concatenate([[0.0], np.cumsum(sorted_lengths, dtype=np.float64)])
    # ``work`` is not part of the paper's cost; planners report it (load per instance).
    starts = bounds[:-1]
    return Items(
        longest=np.asarray(sorted_lengths, dtype=np.float64)[starts],
        count=np.diff(bounds),
        work=np.diff(cumulative[bounds]),
        members=bounds,
    )


def group_cost(instance: EngineInstance, count: int, longest: float) -> float:
    """Predicted seconds for one instance to finish a group (see module docstring)."""
    if count <= 0:
        return 0.0
    return instance.per_token_s * instance.interference(count) * longest


def solve_contiguous(
    items: Items, instances: Sequence[EngineInstance]
) -> tuple[float, list[tuple[int, int]]]:
    """Optimal contiguous split of ``items`` over ``instances`` in the given order.

    Returns the makespan and, per instance, the ``[start, end)`` item range it
    gets (possibly empty).
    """
    if not instances:
        raise ConfigError("no engine instances to place trajectories on; the pool has none ready")
    n, m = len(items), len(instances)
    count_prefix = np.concatenate([[0], np.cumsum(items.count)]).astype(np.int64)
    longest = np.concatenate([items.longest, [0.0]])
    ends = np.arange(n + 1, dtype=np.int64)

    previous = np.full(n + 1, np.inf)
    previous[0] = 0.0
    choices = np.zeros((m, n + 1), dtype=np.int64)
    for j, inst in enumerate(instances):
        slowdown = np.asarray(inst.slowdown, dtype=np.float64)

        def cost(
            k: IntArray, inst: EngineInstance = inst, slowdown: FloatArray = slowdown
        ) -> FloatArray:
            """Cost of items k..i-1 on this instance, for every end i at once."""
            cap = inst.batch_cap
            count = count_prefix[ends] - count_prefix[k]
            # Past the cap requests take turns: F(b) = F(cap) * b / cap.
            factor = np.where(
                count <= cap, slowdown[np.minimum(count, cap)], slowdown[cap] / cap * count
            )
            return np.asarray(inst.per_token_s * factor * longest[k], dtype=np.float64)

        lo = np.zeros(n + 1, dtype=np.int64)
        hi = ends.copy()
        while True:
            open_ = lo < hi
            if not open_.any():
                break
            mid = (lo + hi) // 2
            crossed = previous[mid] >= cost(mid)
            hi = np.where(open_ & crossed, mid, hi)
            lo = np.where(open_ & ~crossed, mid + 1, lo)
        at = previous[lo]  # first k where the earlier instances dominate
        before_k = np.maximum(lo - 1, 0)
        before = np.where(lo > 0, cost(before_k), np.inf)  # one more item on this instance
        take_before = before < at
        current = np.where(take_before, before, at)
        choices[j] = np.where(take_before, before_k, lo)
        previous = current

    ranges: list[tuple[int, int]] = [(0, 0)] * m
    i = n
    for j in range(m - 1, -1, -1):
        k = int(choices[j, i])
        ranges[j] = (k, i)
        i = k
    return float(previous[n]), ranges


def search_contiguous(
    sorted_lengths: FloatArray,
    instances: Sequence[EngineInstance],
    *,
    rel_tol: float = 1e-3,
    probes: int = 64,
) -> float:
    """Makespan of the best contiguous split, within ``rel_tol``, without the DP table.

    For a makespan ``M`` and a fixed instance order, greedily giving each
    instance the longest block it can finish within ``M`` decides feasibility
    exactly (a block starting later faces shorter trajectories). ``probes``
    values of ``M`` are tested at once, in lockstep over the instances, and
    the bracket narrows geometrically. O(m · rounds) numpy calls on arrays of
    ``probes``, whatever the number of trajectories: the shape planner scores
    thousands of candidate shapes with it.
    """
    if not instances:
        raise ConfigError("no engine instances to place trajectories on; the pool has none ready")
    n = len(sorted_lengths)
    if n == 0:
        return 0.0
    lengths = np.concatenate([np.asarray(sorted_lengths, dtype=np.float64), [0.0]])
    tables = [
        (inst.per_token_s, np.asarray(inst.slowdown, dtype=np.float64), inst.batch_cap)
        for inst in instances
    ]

    def feasible(makespans: FloatArray) -> NDArray[np.bool_]:
        position = np.zeros(makespans.size, dtype=np.int64)
        for per_token, slowdown, cap in tables:
            first = lengths[np.minimum(position, n)]
            with np.errstate(divide="ignore"):
                budget = np.where(first > 0, makespans / (per_token * first), np.inf)
            within_cap = np.searchsorted(slowdown, budget, side="right") - 1
            beyond = np.floor(np.minimum(budget, 1e15) * cap / slowdown[cap]).astype(np.int64)
            block = np.where(budget >= slowdown[cap], np.maximum(cap, beyond), within_cap)
            position = np.minimum(n, position + np.maximum(block, 0))
        return position >= n

    fastest = min(t[0] for t in tables)
    lo = fastest * lengths[0]  # the longest trajectory alone on the fastest engine
    per_token, slowdown, cap = tables[0]
    hi = per_token * slowdown[cap] * max(n, cap) / cap * lengths[0]  # all on the first
    hi = max(hi, lo)
    while hi > lo * (1.0 + rel_tol):
        grid = np.geomspace(lo, hi, probes)
        ok = feasible(grid)
        first_ok = int(np.argmax(ok)) if ok.any() else probes - 1
        hi = float(grid[first_ok])
        lo = float(grid[first_ok - 1]) if first_ok > 0 else lo
        if first_ok == 0:
            break
    return float(hi)
