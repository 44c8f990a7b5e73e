"""Migration planners: which trajectories to move, and where, while they wait on tools.

Heddle moves a trajectory only while it is in a tool call, so the move (an
export plus a recompute prefill that warms the destination's prefix cache)
overlaps the tool's latency instead of delaying the next LLM step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from heddle.exceptions import ConfigError

from ._perf import EngineInstance, PerfModel
from ._types import Trajectory, TrajectoryState

__all__ = [
    "MigrationConfig",
    "MigrationPlanner",
    "Move",
    "NoMigration",
    "ToolWindowMigration",
]


@dataclass(frozen=True)
class Move:
    """One planned migration; times in seconds."""

    trajectory_id: str
    source: str
    destination: str
    context_tokens: int
    cost_s: float  # recompute prefill on the destination + fixed transfer overhead
    hidden_s: float  # part of the cost the remaining tool time hides
    gain_s: float  # predicted reduction of the trajectory's remaining time


@dataclass(frozen=True)
class MigrationConfig:
    """Knobs of :class:`ToolWindowMigration`.

    ``overhead_s`` is the fixed cost of a move besides the prefill (export,
    import, bookkeeping); the paper measures 0.15–0.35 s per migration.
    """

    min_gain_s: float = 1.0  # net gain (s) a move must promise
    max_moves_per_round: int = 32
    overhead_s: float = 0.2

    def __post_init__(self) -> None:
        if self.min_gain_s < 0:
            raise ConfigError(f"min_gain_s={self.min_gain_s} must be >= 0")
        if self.max_moves_per_round < 0:
            raise ConfigError(f"max_moves_per_round={self.max_moves_per_round} must be >= 0")
        if self.overhead_s < 0:
            raise ConfigError(f"overhead_s={self.overhead_s} must be >= 0")


class MigrationPlanner(ABC):
    """Proposes moves given each trajectory's planned instance."""

    name: ClassVar[str]

    @abstractmethod
    def plan(
        self,
        trajectories: Sequence[Trajectory],
        target: Callable[[Trajectory], str | None],
        instances: Mapping[str, EngineInstance],
        load: Mapping[str, int],
        now_s: float,
        *,
        busy: Collection[str] = (),
        draining: Collection[str] = (),
    ) -> list[Move]:
        """Moves to start now.

        ``busy`` names instances already sending or receiving a move;
        ``draining`` names instances being removed (their trajectories must
        leave, whatever the gain).
        """


class NoMigration(MigrationPlanner):
    """Baselines: a trajectory never moves on purpose."""

    name = "none"

    def plan(
        self,
        trajectories: Sequence[Trajectory],
        target: Callable[[Trajectory], str | None],
        instances: Mapping[str, EngineInstance],
        load: Mapping[str, int],
        now_s: float,
        *,
        busy: Collection[str] = (),
        draining: Collection[str] = (),
    ) -> list[Move]:
        return []


class ToolWindowMigration(MigrationPlanner):
    """Heddle's opportunistic migration, longest predicted trajectories first.

    A move is proposed for a trajectory that is in a tool call, sits elsewhere
    than its planned instance, and whose predicted gain (remaining tokens ×
    the per-token time difference at the two instances' loads) exceeds the
    part of the move's cost that the remaining tool time does not hide by
    ``min_gain_s``. No two moves share a sender or a receiver, counting moves
    already in flight.
    """

    name = "tool-window"

    def __init__(self, perf: PerfModel, config: MigrationConfig | None = None) -> None:
        self.perf = perf
        self.config = config or MigrationConfig()

    def plan(
        self,
        trajectories: Sequence[Trajectory],
        target: Callable[[Trajectory], str | None],
        instances: Mapping[str, EngineInstance],
        load: Mapping[str, int],
        now_s: float,
        *,
        busy: Collection[str] = (),
        draining: Collection[str] = (),
    ) -> list[Move]:
        cfg = self.config
        taken = set(busy)
        load_now = dict(load)
        moves: list[Move] = []
        candidates = [
            t
            for t in trajectories
            if t.state is TrajectoryState.IN_TOOL and t.instance in instances
        ]
        candidates.sort(key=lambda t: (-t.predicted_remaining_tokens, t.id))
        for traj in candidates:
            if len(moves) >= cfg.max_moves_per_round:
                break
            assert traj.instance is not None
            source = traj.instance
            must_leave = source in draining
            destination = target(traj)
            if must_leave and (destination is None or destination in draining):
                live = [n for n in instances if n not in draining and n not in taken]
                destination = min(live, key=lambda n: load_now.get(n, 0), default=None)
            if destination is None or destination == source or destination not in instances:
                continue
            if destination in draining or source in taken or destination in taken:
                continue
            src, dst = instances[source], instances[destination]
            cost = self.perf.prefill_time(traj.context_tokens, dst.tp) + cfg.overhead_s
            tool_left = max(0.0, (traj.tool_expected_end_s or now_s) - now_s)
            hidden = min(cost, tool_left)
            remaining = traj.predicted_remaining_tokens
            per_token_src = src.per_token_s * src.interference(load_now.get(source, 1))
            per_token_dst = dst.per_token_s * dst.interference(load_now.get(destination, 0) + 1)
            gain = remaining * (per_token_src - per_token_dst)
            if not must_leave and gain - (cost - hidden) < cfg.min_gain_s:
                continue
            moves.append(
                Move(traj.id, source, destination, traj.context_tokens, cost, hidden, gain)
            )
            taken.update((source, destination))
            load_now[source] = load_now.get(source, 1) - 1
            load_now[destination] = load_now.get(destination, 0) + 1
        return moves
