"""The dynamic resource manager: merge engines for the tail of a rollout.

As short trajectories finish, engines run ever smaller batches, where a
step's time is latency-bound; two engines of TP ``t`` merged into one of TP
``2t`` then run the same trajectories' iterations faster (the performance
model says by how much). A merge drains both engines (no new steps go to
them; what they hold finishes or moves elsewhere), and once both are empty
their GPUs come back, after ``reshape_s`` (pod restart plus weight load), as
one engine of twice the TP. The GPU budget is never exceeded in between.

The planner here only decides *which* engines to merge and *when*; the
simulator and the live session carry it out. It is pure: it reads a snapshot
of the engines and the trajectories on them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from heddle.exceptions import ConfigError

from ._perf import PerfModel
from ._shape import ShapeConfig
from ._types import Trajectory

__all__ = ["EngineSnapshot", "Merge", "TailMergeConfig", "TailMergePlanner"]


@dataclass(frozen=True)
class TailMergeConfig:
    """When a merge is worth its cost.

    ``reshape_s`` is the time from both engines being empty to the merged
    engine serving (pod restart plus weight load; the shape planner's figure).
    A merge is made when the merged engine's iteration is at least
    ``min_speedup`` faster than the slower of the two it replaces, for the
    trajectories they hold, and the longest of those trajectories is predicted
    to run for at least ``min_remaining_factor * reshape_s`` more (so the
    faster iterations have time to repay the restart). ``max_pool_occupancy``
    keeps merges to the tail: the trajectories still unfinished must fit the
    other engines' batches at that fraction of their cap, so that draining two
    engines does not make steps queue elsewhere.
    """

    reshape_s: float = ShapeConfig.reshape_s
    min_speedup: float = 0.10
    min_remaining_factor: float = 2.0
    max_pool_occupancy: float = 0.5

    def __post_init__(self) -> None:
        if not (self.reshape_s >= 0 and math.isfinite(self.reshape_s)):
            raise ConfigError(f"reshape_s={self.reshape_s} must be a finite number >= 0")
        if not 0 < self.min_speedup < 1:
            raise ConfigError(f"min_speedup={self.min_speedup} must be in (0, 1)")
        if self.min_remaining_factor < 0:
            raise ConfigError(f"min_remaining_factor={self.min_remaining_factor} must be >= 0")
        if not 0 < self.max_pool_occupancy <= 1:
            raise ConfigError(f"max_pool_occupancy={self.max_pool_occupancy} must be in (0, 1]")


@dataclass(frozen=True)
class EngineSnapshot:
    """An engine as the planner sees it: its TP and the unfinished trajectories it holds."""

    name: str
    tp: int
    trajectories: tuple[Trajectory, ...]


@dataclass(frozen=True)
class Merge:
    """Drain ``engines`` (all of TP ``tp / 2``) and bring their GPUs back as one TP ``tp``."""

    engines: tuple[str, str]
    tp: int
    speedup: float  # 1 - merged iteration time / the slower engine's, for what they hold
    remaining_s: float  # the longest held trajectory's predicted remaining decode time


class TailMergePlanner:
    """Picks at most one pair of engines to merge per call (see the module docstring)."""

    def __init__(
        self,
        perf: PerfModel,
        tensor_parallel_sizes: Sequence[int],
        gpus_per_node: int,
        config: TailMergeConfig | None = None,
    ) -> None:
        self.perf = perf
        self.allowed = frozenset(tensor_parallel_sizes)
        self.gpus_per_node = gpus_per_node
        self.config = config or TailMergeConfig()

    def _iteration_s(self, trajectories: Sequence[Trajectory], tp: int) -> float:
        if not trajectories:
            return 0.0
        context = sum(t.context_tokens for t in trajectories)
        return self.perf.iteration_time(len(trajectories), context, tp)

    def plan(self, engines: Sequence[EngineSnapshot]) -> Merge | None:
        """The pair to merge now, or None. ``engines`` are the serving (not draining) ones."""
        cfg = self.config
        if len(engines) < 3:
            return None  # the pair's trajectories need somewhere to run meanwhile
        unfinished = sum(len(e.trajectories) for e in engines)
        others_room = (len(engines) - 2) * self.perf.batch_cap * cfg.max_pool_occupancy
        if unfinished > others_room:
            return None
        by_tp: dict[int, list[EngineSnapshot]] = {}
        for engine in engines:
            if 2 * engine.tp in self.allowed and 2 * engine.tp <= self.gpus_per_node:
                by_tp.setdefault(engine.tp, []).append(engine)
        best: Merge | None = None
        for tp, group in sorted(by_tp.items()):
            if len(group) < 2:
                continue
            # The two that hold the least: the cheapest to drain.
            a, b = sorted(group, key=lambda e: (len(e.trajectories), e.name))[:2]
            held = a.trajectories + b.trajectories
            if not held:
                continue
            slower = max(self._iteration_s(e.trajectories, tp) for e in (a, b))
            merged = self._iteration_s(held, 2 * tp)
            speedup = 1.0 - merged / slower
            longest = max(t.predicted_remaining_tokens for t in held)
            remaining_s = longest * slower
            if speedup < cfg.min_speedup or remaining_s < cfg.min_remaining_factor * cfg.reshape_s:
                continue
            if best is None or speedup > best.speedup:
                best = Merge((a.name, b.name), 2 * tp, speedup, remaining_s)
        return best

    @staticmethod
    def snapshots(
        instances: Mapping[str, int], trajectories: Sequence[Trajectory]
    ) -> list[EngineSnapshot]:
        """Group unfinished trajectories by the engine holding their context."""
        held: dict[str, list[Trajectory]] = {name: [] for name in instances}
        for traj in trajectories:
            if traj.instance in held and not traj.state.finished:
                held[traj.instance].append(traj)
        return [EngineSnapshot(n, tp, tuple(held[n])) for n, tp in instances.items()]
