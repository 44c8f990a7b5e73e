"""Simulated entities: trajectories following a script, and engines batching them.

An engine runs continuous batching in *segments*: between two batch changes
every running request gains one token per iteration, and the segment's
duration is the closed-form sum of the performance model's iteration times.
A segment ends when the first running request finishes its turn, when the KV
cache fills, or at the next iteration boundary after an arrival that can join.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from .._perf import EngineInstance, PerfModel
from .._types import Trajectory, TrajectoryState
from .._workload import TrajectoryScript

__all__ = ["Segment", "SimEngine", "SimTrajectory"]


@dataclass(slots=True)
class SimTrajectory:
    """A scheduler :class:`Trajectory` plus its script and what happened to it."""

    script: TrajectoryScript
    traj: Trajectory
    remaining_in_turn: int = 0  # tokens left in the current LLM step
    queued_since: float | None = None
    queue_delay_s: float = 0.0  # total time its steps waited to be admitted
    prefill_tokens: int = 0  # tokens (re)computed on admission
    finish_s: float | None = None
    migrating_to: str | None = None
    tool_done: bool = False  # the tool answered while a migration was under way
    migrations: int = 0
    engines: list[str] = field(default_factory=list)  # engine that began each step
    step_started: bool = False
    predicted_total_at_step: dict[int, float] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.traj.id

    def start_turn(self) -> None:
        self.remaining_in_turn = self.script.turn_tokens[self.traj.turns]
        self.step_started = False


@dataclass(slots=True)
class Segment:
    start_s: float
    prefill_s: float
    batch: int
    context: int
    iterations: int
    end_s: float


class _IdleCache:
    """Contexts kept in an engine's KV cache while their trajectory is not running (LRU).

    Pinned entries (trajectory-resident KV) are evicted only when asked to.
    """

    def __init__(self) -> None:
        self.tokens: OrderedDict[str, int] = OrderedDict()
        self.pinned: set[str] = set()
        self.total = 0

    def __contains__(self, trajectory_id: str) -> bool:
        return trajectory_id in self.tokens

    def get(self, trajectory_id: str) -> int:
        return self.tokens.get(trajectory_id, 0)

    def put(self, trajectory_id: str, tokens: int, *, pin: bool = False) -> None:
        self.pop(trajectory_id)
        self.tokens[trajectory_id] = tokens
        self.total += tokens
        if pin:
            self.pinned.add(trajectory_id)

    def pop(self, trajectory_id: str) -> int:
        tokens = self.tokens.pop(trajectory_id, 0)
        self.total -= tokens
        self.pinned.discard(trajectory_id)
        return tokens

    def evict(self, amount: int, *, keep: str | None, pinned_too: bool) -> int:
        """Evict least recent entries until ``amount`` tokens are freed; return tokens freed."""
        freed = 0
        for evict_pinned in (False, True) if pinned_too else (False,):
            for tid in list(self.tokens):
                if freed >= amount:
                    return freed
                if tid == keep or (tid in self.pinned) != evict_pinned:
                    continue
                freed += self.pop(tid)
        return freed


class SimEngine:
    """One engine instance: a priority queue, a running batch, and a prefix cache."""

    def __init__(
        self,
        instance: EngineInstance,
        perf: PerfModel,
        priority: Callable[[Trajectory], float],
        preemptive: bool,
        pin_resident: bool = False,
    ) -> None:
        self.instance = instance
        self.perf = perf
        self.priority = priority
        self.preemptive = preemptive
        # Trajectory-resident KV (Heddle's worker): contexts of trajectories in a tool
        # call are pinned; newcomers may not evict them, so they wait instead.
        self.pin_resident = pin_resident
        self.running: dict[str, SimTrajectory] = {}
        self.running_context = 0  # tokens the running batch holds in KV
        self.waiting: dict[str, SimTrajectory] = {}
        # (priority, id) of waiting steps; a step's priority is fixed while it waits,
        # so the heap stays valid; entries of steps that left are skipped lazily.
        self._queue: list[tuple[float, str]] = []
        self.cache = _IdleCache()
        self._residents: dict[str, SimTrajectory] = {}  # pinned contexts' trajectories
        self.segment: Segment | None = None
        self.version = 0  # bumps whenever the pending wake-up is superseded
        self.pending_prefill_tokens = 0  # migrations warming this engine's cache
        self.draining = False
        self.busy_s = 0.0
        self.generated_tokens = 0
        self.preemptions = 0
        self.busy_intervals: list[tuple[float, float]] = []

    @property
    def name(self) -> str:
        return self.instance.name

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def _free_kv(self, needed: int, keep: str | None = None, pinned_too: bool = False) -> bool:
        """Make room for ``needed`` more tokens, evicting idle caches least recent first.

        Pinned contexts go only when ``pinned_too``; ``keep``'s own cache never goes.
        """
        short = self.running_context + self.cache.total + needed - self.instance.kv_capacity_tokens
        if short <= 0:
            return True
        freed = self.cache.evict(short, keep=keep, pinned_too=pinned_too)
        if pinned_too and self._residents:
            self._residents = {t: s for t, s in self._residents.items() if t in self.cache.pinned}
        return freed >= short

    def _run(self, sim: SimTrajectory) -> None:
        self.running[sim.id] = sim
        self.running_context += sim.traj.context_tokens

    def _stop(self, sim: SimTrajectory) -> None:
        del self.running[sim.id]
        self.running_context -= sim.traj.context_tokens

    def keep(self, sim: SimTrajectory) -> None:
        """A step ended and a tool call began: its context stays (pinned, if resident)."""
        self.cache.put(sim.id, sim.traj.context_tokens, pin=self.pin_resident)
        if self.pin_resident:
            self._residents[sim.id] = sim

    def _evict_outranked(self, needed: int, head: SimTrajectory) -> bool:
        """Unpin and evict resident contexts that ``head`` outranks, lowest priority first.

        A pin protects a trajectory in a tool call from newcomers it outranks,
        not from ones that outrank it (the paper's preemption rule, applied to
        resident KV); the evicted one recomputes when it returns.
        """
        short = self.running_context + self.cache.total + needed - self.instance.kv_capacity_tokens
        rank = self.priority(head.traj)
        victims = sorted(
            (
                (self.priority(self._residents[tid].traj), tid)
                for tid in self.cache.pinned
                if tid != head.id and tid in self._residents
            ),
            reverse=True,
        )
        for priority, tid in victims:
            if short <= 0:
                break
            if priority <= rank:
                break
            short -= self.release_cache(tid)
        return short <= 0

    # -- queueing -------------------------------------------------------------
    def enqueue(self, sim: SimTrajectory, now: float) -> None:
        sim.queued_since = now
        sim.traj.state = TrajectoryState.QUEUED
        self.waiting[sim.id] = sim
        heapq.heappush(self._queue, (self.priority(sim.traj), sim.id))

    def can_start_now(self) -> bool:
        """Would an arrival join (or, preemptively, displace) the batch at the next boundary?"""
        return len(self.running) < self.perf.batch_cap or self.preemptive

    def release_cache(self, trajectory_id: str) -> int:
        self._residents.pop(trajectory_id, None)
        return self.cache.pop(trajectory_id)

    def warm(self, trajectory_id: str, tokens: int) -> None:
        """A migration imports a context: prefill it (next segment) and keep it cached."""
        self.pending_prefill_tokens += tokens
        self.cache.put(trajectory_id, tokens, pin=self.pin_resident)

    # -- segments -------------------------------------------------------------
    def finish_segment(self, now: float) -> list[SimTrajectory]:
        """Credit the segment's iterations; return the requests whose step finished."""
        seg = self.segment
        self.segment = None
        if seg is None:
            return []
        self.busy_s += seg.end_s - seg.start_s
        self.busy_intervals.append((seg.start_s, seg.end_s))
        done: list[SimTrajectory] = []
        n = seg.iterations
        if n:
            for sim in self.running.values():
                sim.remaining_in_turn -= n
                traj = sim.traj
                traj.context_tokens += n
                traj.generated_tokens += n
                if sim.remaining_in_turn <= 0:
                    done.append(sim)
            self.running_context += n * len(self.running)
            self.generated_tokens += n * len(self.running)
        for sim in done:
            self._stop(sim)
        return done

    def cut_segment(self, now: float) -> float | None:
        """An arrival can join: end the segment at the first iteration boundary after ``now``."""
        seg = self.segment
        if seg is None or now >= seg.end_s:
            return None
        decode_elapsed = now - seg.start_s - seg.prefill_s
        done = 0
        if decode_elapsed > 0:
            done = self.perf.iterations_within(
                seg.batch, seg.context, self.instance.tp, decode_elapsed
            )
        iterations = min(seg.iterations, done + 1)
        if iterations >= seg.iterations:
            return None
        seg.iterations = iterations
        seg.end_s = (
            seg.start_s
            + seg.prefill_s
            + self.perf.segment_time(seg.batch, seg.context, self.instance.tp, iterations)
        )
        self.version += 1
        return seg.end_s

    def _admit(self, now: float) -> int:
        """Admit waiting steps by priority (preempting if allowed); return prefill tokens."""
        cap = self.perf.batch_cap
        if self.draining or not self.waiting or (len(self.running) >= cap and not self.preemptive):
            return 0
        prefill = 0
        queue = self._queue
        while queue:
            entry = queue[0]
            sim_or_none = self.waiting.get(entry[1])
            if sim_or_none is None or self.priority(sim_or_none.traj) != entry[0]:
                heapq.heappop(queue)  # it left, or it was re-queued with another priority
                continue
            sim = sim_or_none
            # Preemption takes a batch slot, not KV: evicting a victim that keeps its
            # cache frees no memory, and dropping its cache would only trade recomputes.
            if len(self.running) >= cap and (
                not self.preemptive or not self._preempt_for(sim, now)
            ):
                break
            own = min(self.cache.get(sim.id), sim.traj.context_tokens)
            # An idle engine may break pins rather than sit idle; so may a resident returning.
            pinned_too = not self.running or sim.id in self.cache.pinned
            needed = sim.traj.context_tokens - own
            if not self._free_kv(needed, sim.id, pinned_too) and not (
                self.preemptive and self._evict_outranked(needed, sim)
            ):
                break
            heapq.heappop(queue)
            del self.waiting[sim.id]
            cached = min(self.release_cache(sim.id), sim.traj.context_tokens)
            new_tokens = sim.traj.context_tokens - cached
            prefill += new_tokens
            sim.prefill_tokens += new_tokens
            if sim.queued_since is not None:
                sim.queue_delay_s += now - sim.queued_since
                sim.queued_since = None
            sim.traj.state = TrajectoryState.GENERATING
            sim.traj.instance = self.name
            if not sim.step_started:
                sim.step_started = True
                sim.engines.append(self.name)
            self._run(sim)
        return prefill

    def _preempt_for(self, head: SimTrajectory, now: float) -> bool:
        """The paper's rule: evict the lowest-priority running step if ``head`` outranks it."""
        if not self.running:
            return False
        victim = max(self.running.values(), key=lambda s: (self.priority(s.traj), s.id))
        if self.priority(head.traj) >= self.priority(victim.traj):
            return False
        self._stop(victim)
        self.preemptions += 1
        # The prefix cache is kept: it resumes without recomputing (until evicted).
        self.cache.put(victim.id, victim.traj.context_tokens)
        self.enqueue(victim, now)
        return True

    def start_segment(self, now: float) -> float | None:
        """Admit, then plan the next segment; return its end (None when idle)."""
        if self.segment is not None:
            return self.segment.end_s
        prefill_tokens = self._admit(now) + self.pending_prefill_tokens
        self.pending_prefill_tokens = 0
        if not self.running:
            if prefill_tokens:
                duration = self.perf.prefill_time(prefill_tokens, self.instance.tp)
                self.segment = Segment(now, duration, 0, 0, 0, now + duration)
                self.version += 1
                return self.segment.end_s
            return None
        batch = len(self.running)
        context = self.running_context
        iterations = min(s.remaining_in_turn for s in self.running.values())
        room = self.instance.kv_capacity_tokens - context - self.cache.total
        if context + iterations * batch > self.instance.kv_capacity_tokens:
            iterations = max(1, room // batch) if room > 0 else 1
        prefill_s = self.perf.prefill_time(prefill_tokens, self.instance.tp)
        decode_s = self.perf.segment_time(batch, context, self.instance.tp, iterations)
        self.segment = Segment(
            now, prefill_s, batch, context, iterations, now + prefill_s + decode_s
        )
        self.version += 1
        return self.segment.end_s

    def relieve_kv_pressure(self, now: float) -> None:
        """Evict idle caches, then recompute-preempt the lowest-priority step, until growth fits."""
        while self.running:
            if self._free_kv(len(self.running), pinned_too=True):
                return
            victim = max(self.running.values(), key=lambda s: (self.priority(s.traj), s.id))
            self._stop(victim)
            self.preemptions += 1
            self.enqueue(victim, now)  # its KV is gone: it recomputes on readmission

    def next_wake(self) -> float:
        return self.segment.end_s if self.segment else math.inf
