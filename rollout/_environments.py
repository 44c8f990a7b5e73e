"""Environments: what happens between two LLM steps of a trajectory.

An :class:`Environment` opens one :class:`Episode` per trajectory. The session
asks the episode for the first messages and each turn's token limit, runs the
step, and hands the text to :meth:`Episode.after_turn`, which either ends the
trajectory or returns the messages (tool results) to append before the next
step. ``synthetic`` scripts turns and tool latencies from a simulator
workload; ``tools`` (in ``_tools.py``) calls real HTTP tools.
"""

from __future__ import annotations

import asyncio
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heddle.scheduler import TrajectoryScript, WorkloadSpec, generate

from ._output_record import TrajectoryStatus
from ._tasks import Task

if TYPE_CHECKING:  # _rewards imports _tools, which builds on this module
    from ._rewards import RewardScorer

__all__ = [
    "Environment",
    "Episode",
    "Outcome",
    "ParsedCalls",
    "SyntheticEnvironment",
    "synthetic_tasks",
]


@dataclass(frozen=True)
class Outcome:
    """What follows a turn: more messages, or the end of the trajectory."""

    messages: tuple[Mapping[str, Any], ...] = ()
    done: bool = False
    finish_reason: str = "stop"  # when done: stop (answered), failed, ...
    error: str | None = None  # when failed: why
    tool_calls: tuple[str, ...] = ()  # names of the tools called after this turn
    tool_errors: int = 0
    assistant: Mapping[str, Any] | None = None  # the turn as an OpenAI message with tool_calls
    status: TrajectoryStatus | None = None  # when done: the record's status if not derived
    reward: float | None = None  # when done: a reward the environment itself reports
    reward_info: Mapping[str, Any] | None = None
    restart: bool = False  # start the trajectory afresh (its history dropped, nothing written)


@dataclass(frozen=True)
class ParsedCalls:
    """A turn's tool calls as the worker's (vLLM's) parser read them, in OpenAI's format."""

    content: str
    calls: Sequence[Mapping[str, Any]]


@dataclass
class Episode(ABC):
    """One trajectory's view of the environment."""

    task: Task
    sample: int
    trajectory_id: str
    expected_tool_s: float = 0.0  # what the scheduler may assume a tool call takes
    tool_seconds: float = field(default=0.0, init=False)  # time spent in tools so far

    async def opening(self) -> Outcome | None:
        """Before the first step: the first messages (``messages``), or the end (``done``).

        ``None`` keeps the task's messages; an environment whose agent writes the
        prompt (``external``) waits here for it.
        """
        return None

    def note_step(self, prompt_tokens: int, completion_tokens: int) -> None:
        """The step just run: the context it saw and the tokens it generated."""
        return None

    def finished(self, status: TrajectoryStatus, finish_reason: str) -> None:
        """The trajectory's record is written (or it was given up); nothing follows."""
        return None

    def episode_record(self) -> dict[str, Any] | None:
        """The record's ``episode`` field: how an outside agent ran it (None: no field)."""
        return None

    def turn_limit(self, turn: int, default: int) -> tuple[int, bool]:
        """(max tokens, ignore EOS) of step ``turn`` (0-based)."""
        return default, False

    def chat_tools(self) -> tuple[Sequence[Mapping[str, Any]], str | None]:
        """(tool schemas for the chat template, the worker's tool parser to ask for)."""
        return (), None

    @abstractmethod
    async def after_turn(
        self, turn: int, text: str, finish_reason: str, parsed: ParsedCalls | None = None
    ) -> Outcome:
        """Run the tools the turn asked for (or end the trajectory); ``parsed`` holds the
        calls when the worker parsed them."""


class Environment(ABC):
    name: str
    reward: RewardScorer | None = None  # scores each finished trajectory (the session calls it)

    @abstractmethod
    def episode(self, task: Task, task_index: int, sample: int, trajectory_id: str) -> Episode:
        """A fresh episode for one task sample."""

    def begin(self) -> None:
        """Every episode of the session is made (:meth:`episode`); the rollout starts."""
        return None

    async def close(self) -> None:
        """Release connections (optional)."""
        return None


_FILLER = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]


def _words(n: int, offset: int = 0) -> str:
    n, start = max(1, n), offset % len(_FILLER)
    # Whole copies of the filler, then a cut: the benchmarks make millions of these words.
    return " ".join((_FILLER * ((start + n) // len(_FILLER) + 1))[start : start + n])


@dataclass
class _SyntheticEpisode(Episode):
    script: TrajectoryScript | None = None
    tool_time_scale: float = 1.0

    def turn_limit(self, turn: int, default: int) -> tuple[int, bool]:
        assert self.script is not None
        return self.script.turn_tokens[turn], True

    async def after_turn(
        self, turn: int, text: str, finish_reason: str, parsed: ParsedCalls | None = None
    ) -> Outcome:
        script = self.script
        assert script is not None
        if turn + 1 >= script.turns:
            return Outcome(done=True, finish_reason="stop")
        latency = script.tool_latency_s[turn] * self.tool_time_scale
        if latency > 0:
            await asyncio.sleep(latency)
        self.tool_seconds += latency
        reply = _words(script.tool_output_tokens[turn], offset=turn)
        name = script.tool_names[turn]
        return Outcome(
            messages=({"role": "tool", "content": reply},),
            tool_calls=(name,),
        )


def synthetic_tasks(count: int, workload: WorkloadSpec, seed: int) -> list[Task]:
    """Tasks whose prompts have roughly the workload's prompt lengths (in words)."""
    scripts = generate(dataclasses.replace(workload, prompts=count, samples_per_prompt=1), seed)
    return [
        Task(f"p{i:05d}", ({"role": "user", "content": _words(s.prompt_tokens, offset=i)},))
        for i, s in enumerate(scripts)
    ]


class SyntheticEnvironment(Environment):
    """Scripted turn lengths and tool latencies, the same seed giving the same rollout.

    Each step generates exactly its scripted number of tokens (EOS ignored), so
    real engines can be benchmarked with a random-weight model. Tool replies
    are filler words of the scripted length. Task ``i`` sample ``s`` gets the
    script of prompt ``i`` sample ``s`` of the workload.
    """

    name = "synthetic"

    def __init__(
        self,
        workload: WorkloadSpec,
        tasks: int,
        samples_per_task: int,
        *,
        seed: int = 0,
        tool_time_scale: float = 1.0,
        max_turns: int | None = None,
    ) -> None:
        spec = dataclasses.replace(workload, prompts=tasks, samples_per_prompt=samples_per_task)
        if max_turns is not None:
            spec = dataclasses.replace(spec, max_turns=min(spec.max_turns, max_turns))
        self.scripts: Sequence[TrajectoryScript] = generate(spec, seed)
        self.samples_per_task = samples_per_task
        self.tool_time_scale = tool_time_scale
        means = {t.name: t.latency_s.median for t in workload.tools}
        self.expected_tool_s = (
            sum(means.values()) / len(means) if means else 0.0
        ) * tool_time_scale

    def episode(self, task: Task, task_index: int, sample: int, trajectory_id: str) -> Episode:
        script = self.scripts[task_index * self.samples_per_task + sample]
        return _SyntheticEpisode(
            task,
            sample,
            trajectory_id,
            expected_tool_s=self.expected_tool_s,
            script=script,
            tool_time_scale=self.tool_time_scale,
        )
