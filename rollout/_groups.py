"""Finished GRPO groups for a trainer, oldest version first; the quota and the carry-over.

The session hands every finished trajectory to a :class:`GroupStream`. A group
(all of a task's samples in this session) is *complete* once every member has
finished, and a trainer takes complete groups one by one
(:meth:`GroupStream.next_group`), or a quota of them at a time
(:meth:`GroupStream.next_batch`: one RL iteration, ``spec.asynchrony.groupsPerIteration``).

**The take order.** Under a policy with ``version_age`` (``heddle``) the trainer
takes, of the complete groups it has not taken, those whose oldest step ran on the
oldest weight version first, completion order among equals: heddle.scheduler's
``take_oldest``, the decision the simulator's ``heddle`` iteration policy takes. The
baselines (``verl``, ``slime``, ...) take in completion order, as their trainers do.
A batch's groups are in take order; each group's ``completed`` still says its place
in completion order.

With a quota the stream holds each finished record until its group is taken and
writes it to the output then, so the output holds what the trainer trained on,
in that order, each group whole. Meanwhile:

- **Over-sampling.** At most ``ceil(quota x (1 + overSample))`` groups run that
  the trainer has not taken; the rest wait to start, in task order. The quota's
  groups are the first to finish; the others carry over into the next iteration
  and go on under whatever weights are pushed meanwhile: nothing is dropped, so
  long outputs are not lost to the batch, only later.
- **The staleness bound, for finished members too.** A finished trajectory
  waiting for its siblings can fall past ``maxStalenessVersions`` when weights
  are pushed: with ``pastBound: restart`` it runs again on the new weights (its
  group waits for it), with ``drop`` its record becomes a failed placeholder
  (``finish_reason: past_bound``), with ``finish`` it stays. The session checks
  running trajectories at each step boundary; together no trained group is
  past the bound unless the job says ``finish``.

The stream also says how old a trajectory is (:meth:`GroupStream.age`: pushes since
its first step's version) and whether a push dropped its KV
(:meth:`GroupStream.kv_voided`); the session's priority and placement read them
(heddle.scheduler's ``VersionAgedOrdering`` and ``unpinned``, docs/async.md).

Without a quota nothing is held: records are written as they finish, and a
trainer that asked for the stream (:meth:`GroupStream.follow`) still gets each
group once whole, in the same take order.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from heddle.api import AsynchronySpec
from heddle.exceptions import ConfigError
from heddle.scheduler import kv_voided, take_oldest, version_age

from ._output_record import OutputRecord

__all__ = ["Batch", "FinishedGroup", "GroupStream", "LengthReport", "length_report"]


class _Member(Protocol):
    """What the stream reads of a finished trajectory (the session's TrajectoryRun)."""

    task_index: int
    sample: int
    segments: list[tuple[str | None, int, int]]


@dataclass(frozen=True)
class FinishedGroup:
    """One task's records (by sample), whole, as the trainer takes it."""

    task_id: str
    task_index: int
    records: tuple[OutputRecord, ...]
    completed: int  # its place in completion order (0 = the first group to complete)
    staleness: int  # weight pushes since its oldest step's version, when taken

    def as_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "task_index": self.task_index,
            "completed": self.completed,
            "staleness": self.staleness,
            "records": [dict(r) for r in self.records],
        }


@dataclass(frozen=True)
class Batch:
    """One iteration's groups: the quota, in take order (``last``: the task set ran out)."""

    iteration: int  # 0-based
    weight_version: str | None  # the newest version pushed when the trainer took it
    groups: tuple[FinishedGroup, ...]
    last: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "weight_version": self.weight_version,
            "last": self.last,
            "groups": [g.as_json() for g in self.groups],
        }


@dataclass(frozen=True)
class LengthReport:
    """Generated tokens per trajectory: what the trainer took against what was started."""

    trained: int
    trained_mean_tokens: float
    trained_p90_tokens: float
    started: int
    started_mean_tokens: float
    started_p90_tokens: float

    def as_json(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def _p90(values: list[int]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)])


def length_report(trained: Iterable[int], started: Iterable[int]) -> LengthReport:
    """Mean and p90 (nearest rank) of generated tokens, trained against started."""
    t, s = list(trained), list(started)
    return LengthReport(
        len(t),
        sum(t) / len(t) if t else 0.0,
        _p90(t),
        len(s),
        sum(s) / len(s) if s else 0.0,
        _p90(s),
    )


def generated_tokens(record: OutputRecord) -> int:
    return sum(record["response_mask"])


@dataclass
class _Group:
    size: int  # members in this session
    held: dict[int, Any] = field(default_factory=dict)  # sample -> finished run
    waiting: dict[int, asyncio.Future[bool]] = field(default_factory=dict)
    completed: int | None = None  # completion place while complete and untaken
    records: dict[int, OutputRecord] = field(default_factory=dict)  # written, no quota


class GroupStream:
    """See the module docstring. One per session; the session calls the ``_``-less hooks."""

    def __init__(
        self,
        asynchrony: AsynchronySpec | None,
        *,
        write: Callable[[Any], OutputRecord],
        drop: Callable[[Any, str], None],
        place: Callable[[str | None], int | None],
        pushes: Callable[[], int],
        version: Callable[[], str | None],
        oldest_first: bool = False,
    ) -> None:
        # Groups are known once the session has read its output (resumed samples are not
        # members): begin() gives them; until then a trainer's takes wait.
        self.quota = asynchrony.groups_per_iteration if asynchrony else None
        self.bound = asynchrony.max_staleness_versions if asynchrony else None
        self.past_bound = asynchrony.past_bound if asynchrony else "finish"
        over = asynchrony.over_sample if asynchrony else 0.0
        self.window = math.ceil(self.quota * (1.0 + over)) if self.quota else None
        self._write, self._drop = write, drop
        self._place, self._pushes, self._version = place, pushes, version
        self.oldest_first = oldest_first  # the take order (module docstring)
        self._groups: dict[int, _Group] = {}
        self._place_of: dict[int, int] = {}
        self._admitted = 0
        self._begun = False
        self._taken = 0
        self._complete: list[int] = []  # complete, untaken, in completion order
        self._completions = 0
        self._iteration = 0
        self._changed = asyncio.Event()
        self._closed = False
        self.followed = False  # a trainer takes the groups (else: taken as they complete)
        self.trained_tokens: list[int] = []
        self.started_tokens: list[int] = []  # every record written, trained or not
        self.recalled = 0  # finished members run again past the bound

    # -- the session's hooks --------------------------------------------------------------
    def begin(self, sizes: dict[int, int]) -> None:
        """The groups of this session: task index -> samples it runs (resumed ones not)."""
        self._groups = {i: _Group(n) for i, n in sorted(sizes.items()) if n > 0}
        # Admission order (task order): a group starts once its place < _admitted.
        self._place_of = {index: n for n, index in enumerate(self._groups)}
        self._admitted = min(len(self._groups), self.window or len(self._groups))
        self._begun = True
        self._changed.set()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ended(self) -> bool:
        """Nothing more will come: the session ended, or every group was taken."""
        return self._closed or (self._begun and self._taken == len(self._groups))

    @property
    def holds(self) -> bool:
        """Records wait for their group to be taken (a quota is set)."""
        return self.quota is not None

    def follow(self) -> None:
        """A trainer will take the groups: from now on none is taken for it."""
        self.followed = True

    def release(self) -> None:
        """The trainer takes no more: every group is written as it completes (carried-over
        ones included), so the session can end. Those complete now go out in take order,
        as the trainer would have taken them (oldest version first under ``version_age``)."""
        self.followed = False
        for index in self._take_order(len(self._complete)):
            self._take(index)

    async def admitted(self, task_index: int) -> None:
        """Until ``task_index``'s group may start (over-sampling window)."""
        while True:
            if self._closed or self._position(task_index) < self._admitted:
                return
            await self._wait_change()

    def finished(self, run: Any) -> asyncio.Future[bool] | None:
        """A trajectory ended. With a quota: a future, True when it must run again (past
        the bound), False once its group was taken (its record written). Without: None
        (the session writes the record itself)."""
        group = self._groups.get(run.task_index)
        if group is None:
            return None
        if not self.holds:
            return None
        if self._past_bound(run):
            if self.past_bound == "restart":
                self.recalled += 1
                done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                done.set_result(True)
                return done
            if self.past_bound == "drop":
                self._drop(run, self._stale_reason(run))
        group.held[run.sample] = run
        waiting = group.waiting[run.sample] = asyncio.get_running_loop().create_future()
        if len(group.held) == group.size:
            group.completed = self._completions
            self._completions += 1
            self._complete.append(run.task_index)
            self._changed.set()
            if not self.followed:
                self._take(run.task_index)
        return waiting

    def written(self, run: Any, record: OutputRecord) -> None:
        """Without a quota: a record the session wrote; its group goes out once whole."""
        group = self._groups.get(run.task_index)
        if group is None or not self.followed:
            return  # no trainer follows: nothing to count or keep
        self.started_tokens.append(generated_tokens(record))
        group.records[run.sample] = record
        if len(group.records) == group.size:
            group.completed = self._completions
            self._completions += 1
            self._complete.append(run.task_index)
            self._changed.set()

    def pushed(self) -> None:
        """New weights: finished members of untaken groups that fell past the bound."""
        if not self.holds or self.past_bound == "finish":
            return
        for index, group in self._groups.items():
            for sample, run in list(group.held.items()):
                if not self._past_bound(run):
                    continue
                if self.past_bound == "drop":
                    self._drop(run, self._stale_reason(run))
                    continue
                del group.held[sample]
                self.recalled += 1
                if group.completed is not None:
                    group.completed = None
                    self._complete.remove(index)
                group.waiting.pop(sample).set_result(True)

    def close(self) -> None:
        """The session ends: held records are written (incomplete groups too); takers end."""
        self._closed = True
        for group in self._groups.values():
            for sample in sorted(group.held):
                self.started_tokens.append(generated_tokens(self._write(group.held[sample])))
                future = group.waiting.pop(sample, None)
                if future is not None and not future.done():
                    future.set_result(False)
            group.held.clear()
        self._complete.clear()
        self._changed.set()

    # -- the trainer's side ---------------------------------------------------------------
    async def next_group(self, timeout_s: float | None = None) -> FinishedGroup | None:
        """The next complete group in take order; None at the end (or the timeout)."""
        self.followed = True
        loop = asyncio.get_running_loop()
        until = None if timeout_s is None else loop.time() + timeout_s
        while not self._complete:
            if self._closed or (self._begun and self._taken == len(self._groups)):
                return None
            if not await self._changed_before(until):
                return None
        return self._take(self._take_order(1)[0])

    async def next_batch(self, timeout_s: float | None = None) -> Batch | None:
        """The next ``groupsPerIteration`` groups (fewer, ``last``, when the tasks run out).

        The batch is taken once whole: a timeout takes nothing and returns None.
        """
        if self.quota is None:
            raise ConfigError(
                "a batch is spec.asynchrony.groupsPerIteration groups, and this job sets no "
                "quota: set it, or take groups one at a time (next_group)"
            )
        self.followed = True
        loop = asyncio.get_running_loop()
        until = None if timeout_s is None else loop.time() + timeout_s
        while True:
            untaken = len(self._groups) - self._taken
            want = min(self.quota, untaken)
            if self._closed or (self._begun and want == 0):
                return None
            if self._begun and len(self._complete) >= want:
                break
            if not await self._changed_before(until):
                return None
        groups = tuple(self._take(index) for index in self._take_order(want))
        batch = Batch(self._iteration, self._version(), groups, self._taken == len(self._groups))
        self._iteration += 1
        return batch

    async def _changed_before(self, until: float | None) -> bool:
        """Wait for the next change; False once ``until`` (loop time; None: never) passed."""
        left = None if until is None else until - asyncio.get_running_loop().time()
        if left is not None and left <= 0:
            return False
        try:
            await asyncio.wait_for(self._wait_change(), left)
        except TimeoutError:
            return False
        return True

    def state(self) -> dict[str, Any]:
        """Counts for the trainer's API and the docs' figures."""
        report = self.lengths()
        return {
            "iteration": self._iteration,
            "weight_version": self._version(),
            "groups": len(self._groups),
            "admitted": self._admitted,
            "complete": len(self._complete),
            "taken": self._taken,
            "recalled": self.recalled,
            "quota": self.quota,
            "window": self.window,
            "closed": self._closed,
            "lengths": report.as_json(),
        }

    def lengths(self) -> LengthReport:
        return length_report(self.trained_tokens, self.started_tokens)

    # -- internals ------------------------------------------------------------------------
    def _take_order(self, n: int) -> list[int]:
        """The ``n`` complete groups (task indices) the trainer takes next, in take order."""
        if not self.oldest_first:
            return self._complete[:n]
        places = [self._version_place(index) for index in self._complete]
        return [self._complete[k] for k in take_oldest(places, n)]

    def _version_place(self, task_index: int) -> int:
        """The place of the oldest weight version among the group's steps (as staleness
        counts it); the version served now for a group with no known version."""
        group = self._groups[task_index]
        versions = [s[0] for run in group.held.values() for s in run.segments]
        versions += [s["weight_version"] for r in group.records.values() for s in r["segments"]]
        places = [p for p in map(self._place, versions) if p is not None]
        return min(places, default=self._pushes())

    def _take(self, index: int) -> FinishedGroup:
        group = self._groups[index]
        self._complete.remove(index)
        completed = group.completed if group.completed is not None else -1
        group.completed = None
        if self.holds:
            records = []
            for sample in sorted(group.held):
                records.append(self._write(group.held[sample]))
                group.waiting.pop(sample).set_result(False)
            group.held.clear()
            for record in records:
                self.started_tokens.append(generated_tokens(record))
        else:
            records = [group.records[s] for s in sorted(group.records)]
            group.records.clear()
        if self.followed:
            self.trained_tokens.extend(generated_tokens(r) for r in records)
        self._taken += 1
        if self.window is not None:
            self._admitted = min(len(self._groups), self._taken + self.window)
        self._changed.set()
        return FinishedGroup(
            str(records[0]["task_id"]),
            index,
            tuple(records),
            completed,
            self._staleness(records),
        )

    def _staleness(self, records: Iterable[OutputRecord]) -> int:
        now = self._pushes()
        worst = 0
        for record in records:
            for segment in record["segments"]:
                place = self._place(segment["weight_version"])
                if place is not None:
                    worst = max(worst, now - place)
        return worst

    def age(self, run: _Member) -> int:
        """Weight pushes since ``run``'s first step's version (0 before its first step)."""
        started = self._place(run.segments[0][0]) if run.segments else None
        return version_age(started, self._pushes())

    def kv_voided(self, run: _Member) -> bool:
        """Whether a push since ``run``'s last step dropped its KV (the engine's prefix cache)."""
        last = self._place(run.segments[-1][0]) if run.segments else None
        return kv_voided(last, self._pushes())

    def _past_bound(self, run: _Member) -> bool:
        return self.bound is not None and self.age(run) > self.bound

    def _stale_reason(self, run: _Member) -> str:
        return (
            f"its first step ran on weights version {run.segments[0][0]}, more than "
            f"{self.bound} pushes before version {self._version()} while its group "
            "waited; spec.asynchrony.pastBound is drop"
        )

    def _position(self, task_index: int) -> int:
        return self._place_of.get(task_index, -1)

    async def _wait_change(self) -> None:
        self._changed.clear()
        await self._changed.wait()
