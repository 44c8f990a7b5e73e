"""Shape planners: the TP mix of an EnginePool (the trajectory-adaptive resource manager).

A few high-TP engines cut the per-token time of the long tail; many TP-1
engines give throughput for short trajectories. :class:`AnnealingShapePlanner`
searches the mixes that fit the GPU budget and the nodes, scoring each by the
best contiguous placement's makespan for the current predictions (found by
:func:`._dp.search_contiguous`, which agrees with the DP within 0.1% and
costs milliseconds), plus the reshape cost.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from heddle.exceptions import ConfigError, InfeasibleError

from ._dp import search_contiguous
from ._perf import EngineInstance, PerfModel
from ._types import PoolShape, check_tp_sizes, fits_nodes, node_sizes

__all__ = [
    "AnnealingShapePlanner",
    "FixedShape",
    "ShapeConfig",
    "ShapePlan",
    "ShapePlanner",
]


@dataclass(frozen=True)
class ShapeConfig:
    """The space a shape planner searches, and the price of changing shape.

    ``reshape_s`` is what replacing engine pods costs (pod restart plus weight
    load); a new shape must beat the current one's predicted makespan by more.
    """

    gpu_budget: int
    gpus_per_node: int = 8
    tensor_parallel_sizes: tuple[int, ...] = (1, 2, 4, 8)
    reshape_s: float = 90.0
    iterations: int = 400  # annealing steps
    initial_temperature: float = 0.05  # relative to the starting makespan
    seed: int = 0

    def __post_init__(self) -> None:
        check_tp_sizes(self.tensor_parallel_sizes, self.gpus_per_node)
        if self.gpu_budget < min(self.tensor_parallel_sizes):
            raise ConfigError(
                f"gpu_budget={self.gpu_budget} is below the smallest allowed TP size "
                f"{min(self.tensor_parallel_sizes)}; raise the budget or allow TP 1"
            )
        if self.reshape_s < 0:
            raise ConfigError(f"reshape_s={self.reshape_s} must be >= 0")
        if self.iterations < 0:
            raise ConfigError(f"iterations={self.iterations} must be >= 0")


@dataclass(frozen=True)
class ShapePlan:
    """A proposed shape and why: its predicted makespan and the evaluations spent."""

    shape: PoolShape
    predicted_makespan_s: float
    current_makespan_s: float | None  # the current shape's, when there is one
    reshape: bool  # True when the plan differs from the current shape
    evaluations: int
    # The simulating planner's verdict on scheduling (docs/scheduler.md): None to run the
    # policy asked for; else the step-centric policy to run instead, because trajectory
    # scheduling was predicted not to beat it on this shape, and its in-flight cap.
    fallback_policy: str | None = None
    max_trajectories_per_engine: int | None = None


class ShapePlanner(ABC):
    """Proposes the pool's TP mix for the current predictions."""

    name: ClassVar[str]

    @abstractmethod
    def plan(
        self, remaining_tokens: Sequence[float] | np.ndarray, current: PoolShape | None
    ) -> ShapePlan:
        """The shape to run next (``current`` when no change is worth it)."""


class _Scorer:
    """Predicted makespan of a shape for fixed predictions (memoised)."""

    def __init__(self, perf: PerfModel, lengths: np.ndarray) -> None:
        self.perf = perf
        self.lengths = np.sort(lengths)[::-1]
        self._memo: dict[tuple[int, ...], float] = {}
        self._instance: dict[int, EngineInstance] = {}

    def instance(self, tp: int) -> EngineInstance:
        if tp not in self._instance:
            self._instance[tp] = self.perf.instance(f"tp{tp}", tp)
        return self._instance[tp]

    def __call__(self, tps: tuple[int, ...]) -> float:
        key = tuple(sorted(tps, reverse=True))
        if key not in self._memo:
            # Fastest first: the longest trajectories go to the highest-TP engines.
            instances = sorted(
                (self.instance(tp) for tp in key if self.instance(tp).kv_capacity_tokens),
                key=lambda i: i.per_token_s,
            )
            self._memo[key] = search_contiguous(self.lengths, instances) if instances else math.inf
        return self._memo[key]

    @property
    def evaluations(self) -> int:
        return len(self._memo)


class FixedShape(ShapePlanner):
    """A pinned shape (EnginePool ``shape: [...]``, and every baseline)."""

    name = "fixed"

    def __init__(self, shape: PoolShape) -> None:
        self.shape = shape

    def plan(
        self, remaining_tokens: Sequence[float] | np.ndarray, current: PoolShape | None
    ) -> ShapePlan:
        return ShapePlan(self.shape, math.nan, None, current != self.shape, 0)


class AnnealingShapePlanner(ShapePlanner):
    """Sort-based start, then seeded simulated annealing over split/merge moves.

    Start: the throughput-bound makespan of an all-smallest-TP pool is the
    target; each predicted trajectory whose serial time at the smallest TP
    exceeds it gets its own instance of the smallest TP that meets it (longest
    first, within the budget); the remaining GPUs become smallest-TP engines.
    Moves: split one instance into two of half its TP, or merge two of one TP
    into one of double; every GPU of the budget stays in use (an extra engine
    never hurts the DP's makespan).
    """

    name = "annealing"

    def __init__(self, perf: PerfModel, config: ShapeConfig) -> None:
        self.perf = perf
        self.config = config
        self.allowed = check_tp_sizes(config.tensor_parallel_sizes, config.gpus_per_node)
        usable = [tp for tp in self.allowed if perf.kv_capacity_tokens(tp) > 0]
        if not usable:
            raise InfeasibleError(
                f"{perf.model.name} does not fit on any allowed TP size {list(self.allowed)}; "
                "allow larger tensor-parallel sizes"
            )
        self.usable = tuple(usable)
        self.nodes = node_sizes(config.gpu_budget, config.gpus_per_node)

    # -- the search space ---------------------------------------------------
    def _fill(self, tps: list[int]) -> tuple[int, ...] | None:
        """Pad with the smallest usable TP until the budget is used; None if it cannot fit."""
        smallest = self.usable[0]
        free = self.config.gpu_budget - sum(tps)
        if free < 0:
            return None
        tps = tps + [smallest] * (free // smallest)
        return tuple(sorted(tps, reverse=True)) if fits_nodes(tps, self.nodes) else None

    def _start(self, scorer: _Scorer, lengths: np.ndarray) -> tuple[int, ...]:
        smallest = self.usable[0]
        base = self._fill([])
        if base is None or not base:
            raise InfeasibleError(
                f"no engine of TP{smallest} fits a budget of {self.config.gpu_budget} GPUs"
            )
        inst = scorer.instance(smallest)
        throughput = (
            len(base) * inst.batch_cap / (inst.per_token_s * inst.interference(inst.batch_cap))
        )
        target = float(lengths.sum()) / throughput
        chosen: list[int] = []
        for length in sorted(lengths, reverse=True):
            if length * inst.per_token_s <= target:
                break
            tp = next(
                (t for t in self.usable if length * scorer.instance(t).per_token_s <= target),
                self.usable[-1],
            )
            if tp == smallest or self._fill([*chosen, tp]) is None:
                break
            chosen.append(tp)
        return self._fill(chosen) or base

    def _neighbours(self, tps: tuple[int, ...]) -> list[tuple[int, ...]]:
        counts = Counter(tps)
        result: list[tuple[int, ...]] = []
        for tp in counts:
            if tp // 2 in self.usable and tp % 2 == 0:  # split
                rest = list(tps)
                rest.remove(tp)
                candidate = self._fill([*rest, tp // 2, tp // 2])
                if candidate:
                    result.append(candidate)
            if counts[tp] >= 2 and tp * 2 in self.usable:  # merge
                rest = list(tps)
                rest.remove(tp)
                rest.remove(tp)
                candidate = self._fill([*rest, tp * 2])
                if candidate:
                    result.append(candidate)
        return result

    # -- the search -----------------------------------------------------------
    def plan(
        self, remaining_tokens: Sequence[float] | np.ndarray, current: PoolShape | None
    ) -> ShapePlan:
        cfg = self.config
        lengths = np.asarray(remaining_tokens, dtype=np.float64)
        if lengths.size == 0:
            shape = current or PoolShape.of(list(self._fill([]) or ()))
            return ShapePlan(shape, 0.0, 0.0 if current else None, False, 0)
        scorer = _Scorer(self.perf, lengths)
        rng = random.Random(cfg.seed)
        state = self._start(scorer, lengths)
        cost = scorer(state)
        best, best_cost = state, cost
        temperature = cfg.initial_temperature * cost if math.isfinite(cost) else 1.0
        for step in range(cfg.iterations):
            options = self._neighbours(state)
            if not options:
                break
            candidate = options[rng.randrange(len(options))]
            candidate_cost = scorer(candidate)
            t = temperature * (1.0 - step / cfg.iterations) + 1e-12
            delta = candidate_cost - cost
            if delta <= 0 or rng.random() < math.exp(-delta / t):
                state, cost = candidate, candidate_cost
                if cost < best_cost:
                    best, best_cost = state, cost
        proposed = PoolShape.of(list(best))
        if current is None:
            return ShapePlan(proposed, best_cost, None, False, scorer.evaluations)
        current_cost = scorer(tuple(current.tps()))
        if proposed != current and best_cost + cfg.reshape_s < current_cost:
            return ShapePlan(proposed, best_cost, current_cost, True, scorer.evaluations)
        return ShapePlan(current, current_cost, current_cost, False, scorer.evaluations)
