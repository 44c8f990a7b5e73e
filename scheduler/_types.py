"""The scheduler's data model: trajectories, their states, and pool shapes."""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from heddle.exceptions import ConfigError, InfeasibleError

__all__ = [
    "FinishedTrajectory",
    "PoolShape",
    "Trajectory",
    "TrajectoryState",
    "check_tp_sizes",
    "fits_nodes",
    "node_sizes",
]


class TrajectoryState(enum.Enum):
    """Where a trajectory is in its agent loop."""

    QUEUED = "queued"  # waiting for its next LLM step to be admitted
    GENERATING = "generating"  # an LLM step is running on an engine
    IN_TOOL = "in_tool"  # waiting on a tool call; the only state in which it may migrate
    DONE = "done"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (TrajectoryState.DONE, TrajectoryState.FAILED)


@dataclass(slots=True)
class Trajectory:
    """A trajectory as the scheduler tracks it while it runs.

    Lengths are output (decode) tokens unless the name says otherwise.
    ``group_id`` ties GRPO siblings: the samples of one prompt.
    """

    id: str
    group_id: str
    prompt_tokens: int
    arrival_s: float = 0.0
    ready_s: float = 0.0  # when its current step became ready to run (FCFS key)
    state: TrajectoryState = TrajectoryState.QUEUED
    turns: int = 0  # LLM steps finished
    generated_tokens: int = 0
    context_tokens: int = 0  # prompt + generated + tool output: what the KV cache holds
    tool_calls: int = 0
    turn_tokens: list[int] = field(default_factory=list)  # output tokens of each finished step
    instance: str | None = None  # engine holding its context (prefix cache)
    tool_expected_end_s: float | None = None  # while IN_TOOL: when the tool should answer
    predicted_remaining_tokens: float = 0.0
    predicted_remaining_turns: float = 0.0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0:
            raise ConfigError(f"trajectory {self.id!r}: prompt_tokens={self.prompt_tokens} < 0")
        if self.context_tokens == 0:
            self.context_tokens = self.prompt_tokens

    @property
    def predicted_total_tokens(self) -> float:
        return self.generated_tokens + self.predicted_remaining_tokens


@dataclass(frozen=True, slots=True)
class FinishedTrajectory:
    """What the predictor learns from: one trajectory's final length.

    Also the record an earlier rollout hands over to seed the predictor.
    """

    group_id: str
    prompt_tokens: int
    total_tokens: int  # output tokens over all turns
    turns: int
    turn_tokens: tuple[int, ...] = ()  # per step, when known: teaches the rate model
    tool_output_tokens: tuple[int, ...] = ()  # each tool reply's tokens, when known (KV size)
    tool_latency_s: tuple[float, ...] = ()  # each tool call's duration, when known

    @classmethod
    def predicted(cls, trajectory: Trajectory) -> FinishedTrajectory:
        """The record a trajectory's prediction stands for: what the shape and co-location
        decisions simulate when no earlier rollout is known (the live session's prior
        sketch and the simulator alike). At least one token and one turn."""
        return cls(
            trajectory.group_id,
            trajectory.prompt_tokens,
            max(1, round(trajectory.predicted_remaining_tokens)),
            max(1, round(trajectory.predicted_remaining_turns)),
        )


def check_tp_sizes(sizes: Iterable[int], gpus_per_node: int) -> tuple[int, ...]:
    """Validate allowed tensor-parallel sizes; return them sorted and deduplicated."""
    if gpus_per_node < 1:
        raise ConfigError(f"gpus_per_node={gpus_per_node} must be at least 1")
    result = tuple(sorted(set(sizes)))
    if not result:
        raise ConfigError("tensor_parallel_sizes is empty; allow at least one size, e.g. [1]")
    divisors = [d for d in range(1, gpus_per_node + 1) if gpus_per_node % d == 0]
    for tp in result:
        if tp < 1 or gpus_per_node % tp != 0:
            raise ConfigError(
                f"tensor-parallel size {tp} does not divide gpus_per_node={gpus_per_node}; "
                f"use sizes from {divisors}"
            )
    return result


@dataclass(frozen=True)
class PoolShape:
    """A multiset of TP degrees: how an EnginePool's GPUs are cut into engine instances.

    ``counts`` maps a TP degree to its number of replicas; build one with
    :meth:`of` (``PoolShape.of({4: 2, 1: 8})`` is 2×TP4 + 8×TP1, 16 GPUs).
    """

    counts: tuple[tuple[int, int], ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, counts: dict[int, int] | Iterable[int]) -> PoolShape:
        """From ``{tp: replicas}`` or from a list of per-instance TP degrees."""
        tally = Counter(counts)
        for tp, n in tally.items():
            if tp < 1 or n < 0:
                raise ConfigError(f"shape entry tp={tp} replicas={n}: both must be positive")
        return cls(tuple(sorted(((tp, n) for tp, n in tally.items() if n > 0), reverse=True)))

    @property
    def gpus(self) -> int:
        return sum(tp * n for tp, n in self.counts)

    @property
    def num_instances(self) -> int:
        return sum(n for _, n in self.counts)

    def tps(self) -> list[int]:
        """Per-instance TP degrees, largest first."""
        return [tp for tp, n in self.counts for _ in range(n)]

    def as_dict(self) -> dict[int, int]:
        return dict(self.counts)

    def __str__(self) -> str:
        return " + ".join(f"{n}xTP{tp}" for tp, n in self.counts) or "empty"

    def validate(self, gpu_budget: int, gpus_per_node: int, allowed_tp: Sequence[int]) -> None:
        """Raise :class:`ConfigError` unless the shape fits budget, nodes and allowed sizes."""
        allowed = check_tp_sizes(allowed_tp, gpus_per_node)
        if gpu_budget < 1:
            raise ConfigError(f"GPU budget {gpu_budget} must be at least 1")
        for tp, _ in self.counts:
            if tp not in allowed:
                raise ConfigError(f"shape {self} uses TP{tp}; allowed sizes are {list(allowed)}")
        if self.gpus > gpu_budget:
            raise ConfigError(
                f"shape {self} needs {self.gpus} GPUs but the budget is {gpu_budget}; "
                "remove replicas or lower their TP"
            )
        if not fits_nodes(self.tps(), node_sizes(gpu_budget, gpus_per_node)):
            raise InfeasibleError(
                f"shape {self} does not pack onto nodes of {gpus_per_node} GPUs within "
                f"{gpu_budget} GPUs: an instance never spans nodes"
            )


def node_sizes(gpu_budget: int, gpus_per_node: int) -> list[int]:
    """GPUs per node that the budget covers: full nodes, then one partial node."""
    full, rest = divmod(gpu_budget, gpus_per_node)
    return [gpus_per_node] * full + ([rest] if rest else [])


def fits_nodes(tps: Sequence[int], nodes: Sequence[int]) -> bool:
    """Whether the instances pack onto the nodes, none spanning two (exact).

    Largest first into each distinct free capacity, backtracking; equal
    capacities are tried once, which keeps the search tiny for real pools.
    """
    sizes = sorted(tps, reverse=True)
    if sum(sizes) > sum(nodes):
        return False

    def place(i: int, free: list[int]) -> bool:
        if i == len(sizes):
            return True
        tried: set[int] = set()
        for k, room in enumerate(free):
            if room >= sizes[i] and room not in tried:
                tried.add(room)
                free[k] -= sizes[i]
                if place(i + 1, free):
                    return True
                free[k] += sizes[i]
        return False

    return place(0, list(nodes))
