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

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from heddle.exceptions import ConfigError

from ._perf import EngineInstance

_TINY = 1e-200  # stands in for a zero length (see _Blocks)

__all__ = [
    "Items",
    "aggregate",
    "group_cost",
    "search_contiguous",
    "solve_contiguous",
    "split_contiguous",
]

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


class _Blocks:
    """The instances of one order as arrays: how long a block each can take within a makespan.

    A block's cost is ``T * F(count) * L(first)``: it grows with the count and
    with its first (longest) member, so "the longest block starting at
    ``position`` that finishes within ``M``" is one lookup in ``F``.
    """

    def __init__(
        self,
        sorted_lengths: FloatArray,
        instances: Sequence[EngineInstance],
        arrays: dict[tuple[float, ...], FloatArray] | None = None,
    ) -> None:
        if not instances:
            raise ConfigError(
                "no engine instances to place trajectories on; the pool has none ready"
            )
        self.n = len(sorted_lengths)
        lengths = np.concatenate([np.asarray(sorted_lengths, dtype=np.float64), [0.0]])
        # A zero-length first member would divide by zero: any count fits, as with a tiny one.
        self.lengths = np.maximum(lengths, _TINY)
        self.instances = list(instances)
        # One array per interference curve (a pool has a few classes, many instances);
        # ``arrays`` shares them between the orders of one placement.
        arrays = {} if arrays is None else arrays
        for inst in instances:
            if inst.slowdown not in arrays:
                arrays[inst.slowdown] = np.asarray(inst.slowdown, dtype=np.float64)
        self.tables = [(i.per_token_s, arrays[i.slowdown], i.batch_cap) for i in instances]
        self.scalar_lengths: list[float] = lengths.tolist()
        self.cumulative_work = np.concatenate([[0.0], np.cumsum(lengths[:-1])])
        self.scalar_tables = [(i.per_token_s, i.slowdown, i.batch_cap) for i in instances]

    def longest_block(self, j: int, position: IntArray, makespans: FloatArray) -> IntArray:
        """Largest count instance ``j`` finishes within each makespan, starting at ``position``
        (``position <= n``). Called m times per probe round: kept to a few array operations."""
        per_token, slowdown, cap = self.tables[j]
        budget = makespans / (per_token * self.lengths[position])  # F(count) may reach this
        within_cap = np.searchsorted(slowdown, budget, side="right") - 1
        # Past the cap requests take turns: F(b) = F(cap) * b / cap.
        beyond = (np.minimum(budget, 1e15) * (cap / slowdown[cap])).astype(np.int64)
        over = budget >= slowdown[cap]
        # Annotated: some numpy releases (2.4) type np.where's result as Any.
        counts: IntArray = np.where(over, np.maximum(beyond, cap), within_cap)
        return counts

    def cost(self, j: int, start: int, end: int) -> float:
        return group_cost(self.instances[j], end - start, self.scalar_lengths[start])

    def longest_block_at(self, j: int, position: int, makespan: float) -> int:
        """:meth:`longest_block` for one position and makespan, in plain Python (no array
        overhead: the split and the refinement ask one at a time)."""
        per_token, slowdown, cap = self.scalar_tables[j]
        first = self.scalar_lengths[min(position, self.n)]
        if first <= 0:
            return self.n
        budget = makespan / (per_token * first)
        if budget >= slowdown[cap]:
            return max(cap, math.floor(min(budget, 1e15) * cap / slowdown[cap]))
        return max(bisect.bisect_right(slowdown, budget) - 1, 0)

    def reach(self, makespans: FloatArray) -> IntArray:
        """How far greedy blocks (each instance the longest it can) get, per makespan."""
        position = np.zeros(makespans.size, dtype=np.int64)
        for j in range(len(self.tables)):
            position = np.minimum(position + self.longest_block(j, position, makespans), self.n)
        return position

    def feasible(self, makespan: float) -> bool:
        position = 0
        for j in range(len(self.tables)):
            position = min(self.n, position + self.longest_block_at(j, position, makespan))
        return position >= self.n

    def initial_bracket(self) -> tuple[float, float]:
        """(a lower bound, a feasible makespan) for the optimum of this order."""
        fastest = min(t[0] for t in self.tables)
        lo = fastest * self.lengths[0]  # the longest trajectory alone on the fastest engine
        per_token, slowdown, cap = self.tables[0]
        hi = per_token * slowdown[cap] * max(self.n, cap) / cap * self.lengths[0]  # all on one
        return float(lo), float(max(hi, lo))

    def narrow(self, lo: float, hi: float, probes: int) -> tuple[float, float]:
        """One round: ``probes`` makespans between ``lo`` and ``hi`` tested at once."""
        grid = np.geomspace(lo, hi, probes)
        ok = self.reach(grid) >= self.n
        first_ok = int(np.argmax(ok)) if ok.any() else probes - 1
        if first_ok == 0:  # the lower bound itself is feasible: it is the optimum
            return float(grid[0]), float(grid[0])
        return float(grid[first_ok - 1]), float(grid[first_ok])

    def bracket(self, rel_tol: float, probes: int) -> float:
        """Smallest feasible makespan within ``rel_tol``, narrowing geometrically."""
        lo, hi = self.initial_bracket()
        while hi > lo * (1.0 + rel_tol):
            lo, hi = self.narrow(lo, hi, probes)
        return hi

    def split(self, makespan: float) -> list[tuple[int, int]]:
        """A contiguous split finishing within a feasible ``makespan``, load spread evenly.

        Greedy blocks alone would pack the first instances full and leave the last
        ones idle, which a wrong prediction punishes. So each instance's end lies
        between the least that leaves the rest feasible (``latest``, from a greedy
        pass backwards) and the most it can finish (a greedy block), as close as
        that allows to its share of the remaining work by throughput.
        """
        n, m = self.n, len(self.tables)
        latest = [n] * (m + 1)  # latest[j]: the earliest start instances j.. can finish from
        lengths = self.scalar_lengths
        for j in range(m - 1, -1, -1):
            per_token, slowdown, cap = self.scalar_tables[j]
            tail = slowdown[cap] / cap
            end, lo, hi = latest[j + 1], 0, latest[j + 1]
            while lo < hi:  # a block's cost only falls as its start moves later
                mid = (lo + hi) // 2
                count = end - mid
                factor = slowdown[count] if count <= cap else tail * count
                if per_token * factor * lengths[mid] <= makespan:
                    hi = mid
                else:
                    lo = mid + 1
            latest[j] = lo
        throughput = np.array([cap / (t * slowdown[cap]) for t, slowdown, cap in self.tables])
        remaining = np.cumsum(throughput[::-1])[::-1]
        work = self.cumulative_work
        ranges: list[tuple[int, int]] = []
        start = 0
        for j in range(m):
            if j == m - 1:
                end = n
            else:
                most = start + self.longest_block_at(j, start, makespan)
                # Its share of the remaining work (tokens), by throughput.
                goal = work[start] + (work[n] - work[start]) * throughput[j] / remaining[j]
                share = int(np.searchsorted(work, goal, side="left"))
                end = min(max(share, latest[j + 1], start), most, n)
            ranges.append((start, end))
            start = end
        return ranges

    def makespan_of(self, ranges: list[tuple[int, int]]) -> float:
        return max(self.cost(j, start, end) for j, (start, end) in enumerate(ranges))


def split_contiguous(
    sorted_lengths: FloatArray,
    orders: Sequence[Sequence[EngineInstance]],
    *,
    rel_tol: float = 1e-4,
    probes: int = 64,
    max_refinements: int = 16,
) -> tuple[float, int, list[tuple[int, int]]]:
    """Best contiguous split of ``sorted_lengths`` over the best of several instance
    ``orders``, without the DP table: the same optimum as :func:`solve_contiguous`, at
    any size. Returns (makespan, index of the order, per instance its range).

    The parametric search brackets each order's optimum within ``rel_tol``
    (orders that cannot win drop out early); only the orders tied for best are
    split (:meth:`_Blocks.split`). While a makespan just under a split's own is
    still feasible, it is split again: the optimum is the cost of some block, so
    this ends on it (in practice after one or two refinements;
    ``max_refinements`` bounds pathological cases, within ``rel_tol``).
    O(m · (log n + rounds)) small numpy calls per order.
    """
    if not orders:
        raise ConfigError("no engine instances to place trajectories on; the pool has none ready")
    ordered = np.asarray(sorted_lengths, dtype=np.float64)
    arrays: dict[tuple[float, ...], FloatArray] = {}
    candidates = [_Blocks(ordered, o, arrays) for o in orders]
    if candidates[0].n == 0:
        return 0.0, 0, [(0, 0)] * len(orders[0])
    # All orders narrow in lockstep; an order whose lower end passes another's feasible
    # makespan cannot win and stops (usually all but one or two after the first round).
    brackets = [blocks.initial_bracket() for blocks in candidates]
    live = list(range(len(candidates)))
    while True:
        best_hi = min(brackets[k][1] for k in live)
        live = [k for k in live if brackets[k][0] <= best_hi]
        open_ = [k for k in live if brackets[k][1] > brackets[k][0] * (1.0 + rel_tol)]
        if not open_:
            break
        for k in open_:
            brackets[k] = candidates[k].narrow(*brackets[k], probes)
    tied = min(brackets[k][1] for k in live) * (1.0 + rel_tol) ** 2
    best: tuple[float, int, list[tuple[int, int]]] | None = None
    for k in live:
        blocks = candidates[k]
        if brackets[k][1] > tied:
            continue
        ranges = blocks.split(brackets[k][1])
        makespan = blocks.makespan_of(ranges)
        for _ in range(max_refinements):
            below = makespan * (1.0 - 1e-12)
            if not blocks.feasible(below):
                break
            ranges = blocks.split(below)
            makespan = blocks.makespan_of(ranges)
        if best is None or makespan < best[0]:
            best = (makespan, k, ranges)
    assert best is not None
    return best


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
    blocks = _Blocks(np.asarray(sorted_lengths, dtype=np.float64), instances)
    if blocks.n == 0:
        return 0.0
    return blocks.bracket(rel_tol, probes)
