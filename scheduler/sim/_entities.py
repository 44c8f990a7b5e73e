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

__all__ = ["Segment", "SimEngine", "SimTrajectory", "drop_caches", "interrupt_engine", "requeue"]


@dataclass(slots=True)
class SimTrajectory:
    """A scheduler :class:`Trajectory` plus its script and what happened to it."""

    script: TrajectoryScript
    traj: Trajectory
    remaining_in_turn: int = 0  # tokens left in the current LLM step
    queued_since: float | None = None
    queue_delay_s: float = 0.0  # total time its steps waited to be admitted
    prefill_tokens: int = 0  # tokens (re)computed on admission
    shared_prompt_tokens: int = 0  # its group's prompt found held by a sibling on admission
    finish_s: float | None = None
    migrating_to: str | None = None
    tool_done: bool = False  # the tool answered while a migration was under way
    migrations: int = 0
    engines: list[str] = field(default_factory=list)  # engine that began each step
    step_started: bool = False
    predicted_total_at_step: dict[int, float] = field(default_factory=dict)
    # While it runs on an engine: that engine's iteration clock when its counters were
    # last brought up to date, and the order it joined the batch in (see SimEngine).
    credited_at: float = 0.0
    run_seq: int = 0

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
    draft_tokens: int = 0  # K verified per sequence per iteration (0: no speculation)
    tokens_per_step: float = 1.0  # tokens each running request gains per iteration


class _IdleCache:
    """Contexts kept in an engine's prefix cache while their trajectory is not running (LRU).

    Like vLLM's prefix cache: any newcomer may evict them, least recent first.
    Each entry remembers its GRPO group and prompt length (:class:`_SharedPrompts`).
    """

    def __init__(self) -> None:
        self.tokens: OrderedDict[str, tuple[int, str, int]] = OrderedDict()
        self.total = 0

    def __contains__(self, trajectory_id: str) -> bool:
        return trajectory_id in self.tokens

    def get(self, trajectory_id: str) -> int:
        entry = self.tokens.get(trajectory_id)
        return 0 if entry is None else entry[0]

    def put(self, trajectory_id: str, tokens: int, group_id: str, prompt_tokens: int) -> None:
        assert trajectory_id not in self.tokens  # the engine pops an old entry first
        self.tokens[trajectory_id] = (tokens, group_id, prompt_tokens)
        self.total += tokens

    def pop(self, trajectory_id: str) -> tuple[int, str, int] | None:
        entry = self.tokens.pop(trajectory_id, None)
        if entry is not None:
            self.total -= entry[0]
        return entry

    def oldest(self, *, keep: str | None) -> str | None:
        """The least recent entry other than ``keep`` (None when there is none)."""
        for tid in self.tokens:
            if tid != keep:
                return tid
        return None


class _SharedPrompts:
    """GRPO siblings' common prompt, held once in an engine's KV cache.

    vLLM's prefix cache shares the blocks of an identical prompt between every
    request that holds it, running or idle, so a group's prompt costs its
    tokens once per engine however many siblings hold it there; a sibling
    admitted while another holds it prefills only what follows the prompt.
    ``saved_tokens`` is what the holders' contexts count beyond that one copy.
    Siblings are known by group and prompt length (a group's samples share one
    prompt). Attention still reads the prompt once per sequence: the decode
    cost is unchanged.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # off: every context holds its own prompt (SimConfig)
        self.holders: dict[tuple[str, int], int] = {}
        self.saved_tokens = 0

    def held(self, group_id: str, prompt_tokens: int) -> bool:
        return (group_id, prompt_tokens) in self.holders

    def add(self, group_id: str, prompt_tokens: int) -> None:
        if not self.enabled:
            return
        key = (group_id, prompt_tokens)
        n = self.holders.get(key, 0)
        if n:
            self.saved_tokens += prompt_tokens
        self.holders[key] = n + 1

    def remove(self, group_id: str, prompt_tokens: int) -> None:
        if not self.enabled:
            return
        key = (group_id, prompt_tokens)
        n = self.holders[key] - 1
        if n:
            self.holders[key] = n
            self.saved_tokens -= prompt_tokens
        else:
            del self.holders[key]


class SimEngine:
    """One engine instance: a priority queue, a running batch, and a prefix cache.

    A segment's iterations are credited lazily: the engine counts the iterations
    its batches have run (``clock``), and a running request's counters are brought
    up to date only when it leaves the batch (its step finished, or it was
    preempted). A heap keyed by the clock value at which each running request's
    step ends finds the finished ones and the next segment's length without a
    scan of the batch, so a segment end costs O(finished · log batch), not O(batch).
    Nothing reads a running request's counters mid-segment (the predictor and the
    planners see them between steps), so the results are those of eager crediting.

    It does what vLLM's v1 scheduler (0.32, ``scheduling_policy="priority"``)
    does and nothing more: waiting steps are admitted highest priority first
    while the batch has a free slot and the KV cache has room (idle prefix
    caches are evicted least recent first to make it); a running step is never
    displaced by a waiting one; when the running batch's KV no longer fits, the
    lowest-priority running step is preempted and loses its KV (recompute).
    The paper's rule of evicting a running step for a higher-priority waiting
    one has no counterpart in vLLM, so it is not simulated (docs/simulator.md).
    """

    def __init__(
        self,
        instance: EngineInstance,
        perf: PerfModel,
        priority: Callable[[Trajectory], float],
        share_prompts: bool = True,
    ) -> None:
        self.instance = instance
        self.perf = perf
        self.priority = priority
        self.running: dict[str, SimTrajectory] = {}
        self.running_context = 0  # tokens the running batch holds in KV
        # Tokens each running request has been credited so far (iterations without
        # speculation; with it, iterations times the batch's tokens per step).
        self.clock = 0.0
        # (clock at which its step ends, run_seq, id) per running request; entries of
        # requests that left the batch early are skipped lazily (run_seq tells them apart).
        self._ends: list[tuple[float, int, str]] = []
        self._run_seq = 0
        self.waiting: dict[str, SimTrajectory] = {}
        # (priority, id) of waiting steps; a step's priority is fixed while it waits,
        # so the heap stays valid; entries of steps that left are skipped lazily.
        self._queue: list[tuple[float, str]] = []
        self.cache = _IdleCache()
        # A group's prompt, held once by running requests and idle caches alike.
        self.prompts = _SharedPrompts(share_prompts)
        self.segment: Segment | None = None
        self.version = 0  # bumps whenever the pending wake-up is superseded
        self.pending_prefill_tokens = 0  # migrations warming this engine's cache
        self.draining = False
        self._arriving = 0  # steps routed here still on their way (a profiled step overhead)
        # Told whenever ``load`` changes (the simulator's live cluster view).
        self.on_load_change: Callable[[SimEngine], None] | None = None
        # Speculative decoding: (drafts K, tokens per step) for the running batch at a
        # segment's start, given the time (sim/_speculation.py); None runs plain decode.
        self.speculation: Callable[[SimEngine, float], tuple[int, float]] | None = None
        # Told when a request's step ends here (the session then holds its text).
        self.on_step_end: Callable[[SimEngine, SimTrajectory, float], None] | None = None
        # Seconds of work outside the model owed before the next segment (texts the
        # session inserted into this engine's suffix cache; the engine loop runs them).
        self.pending_host_s = 0.0
        self.spec_steps = 0  # iterations that verified drafts
        self.spec_tokens = 0.0  # tokens those iterations produced per sequence, summed
        self.busy_s = 0.0
        self.generated_tokens = 0
        self.preemptions = 0
        self.busy_intervals: list[tuple[float, float]] = []

    @property
    def name(self) -> str:
        return self.instance.name

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting) + self._arriving

    @property
    def arriving(self) -> int:
        return self._arriving

    @arriving.setter
    def arriving(self, value: int) -> None:
        self._arriving = value
        self._load_changed()

    def _load_changed(self) -> None:
        if self.on_load_change is not None:
            self.on_load_change(self)

    @property
    def kv_used_tokens(self) -> int:
        """Tokens in the KV cache: running contexts and idle caches, shared prompts once."""
        return self.running_context + self.cache.total - self.prompts.saved_tokens

    def _free_kv(self, needed: int, keep: str | None = None) -> bool:
        """Make room for ``needed`` more tokens, evicting idle caches least recent first.

        ``keep``'s own cache never goes (it is about to be used).
        """
        capacity = self.instance.kv_capacity_tokens
        while self.kv_used_tokens + needed > capacity:
            oldest = self.cache.oldest(keep=keep)
            if oldest is None:
                return False
            self.release_cache(oldest)
        return True

    def _reusable(self, sim: SimTrajectory) -> int:
        """Tokens of ``sim``'s context this engine holds: its own cache, or its group's prompt."""
        traj = sim.traj
        own = min(self.cache.get(sim.id), traj.context_tokens)
        shared = traj.prompt_tokens if self.prompts.held(traj.group_id, traj.prompt_tokens) else 0
        return max(own, min(shared, traj.context_tokens))

    def _run(self, sim: SimTrajectory) -> None:
        self.running[sim.id] = sim
        self.running_context += sim.traj.context_tokens
        self.prompts.add(sim.traj.group_id, sim.traj.prompt_tokens)
        self._run_seq += 1
        sim.run_seq = self._run_seq
        sim.credited_at = self.clock
        heapq.heappush(self._ends, (self.clock + sim.remaining_in_turn, sim.run_seq, sim.id))

    def _credit(self, sim: SimTrajectory) -> int:
        """Bring a running request's counters up to the engine's clock.

        Returns the tokens the batch-level count gave it beyond its step's end (a
        speculative step can overshoot it; a request never generates past it).
        """
        raw = math.floor(self.clock + 1e-9) - math.floor(sim.credited_at + 1e-9)
        sim.credited_at = self.clock
        n = min(raw, max(sim.remaining_in_turn, 0))
        if n:
            sim.remaining_in_turn -= n
            traj = sim.traj
            traj.context_tokens += n
            traj.generated_tokens += n
        return raw - n

    def _stop(self, sim: SimTrajectory) -> None:
        over = self._credit(sim)
        del self.running[sim.id]
        self.running_context -= sim.traj.context_tokens + over
        self.prompts.remove(sim.traj.group_id, sim.traj.prompt_tokens)
        self.generated_tokens -= over
        self._load_changed()

    def _fewest_left(self) -> float:
        """Tokens left in the running step closest to its end (the batch is not empty)."""
        first = self._live_end()
        assert first is not None  # every running request has an entry
        return first[0] - self.clock

    def _live_end(self) -> tuple[float, int, str] | None:
        """The running request whose step ends first (drops entries of ones that left)."""
        ends = self._ends
        while ends:
            entry = ends[0]
            sim = self.running.get(entry[2])
            if sim is not None and sim.run_seq == entry[1]:
                return entry
            heapq.heappop(ends)
        return None

    def keep(self, sim: SimTrajectory) -> None:
        """A step ended and a tool call began: its context stays in the prefix cache (LRU)."""
        self._cache_put(sim.traj, sim.traj.context_tokens)

    def _cache_put(self, traj: Trajectory, tokens: int) -> None:
        self.release_cache(traj.id)
        self.cache.put(traj.id, tokens, traj.group_id, traj.prompt_tokens)
        self.prompts.add(traj.group_id, traj.prompt_tokens)

    # -- queueing -------------------------------------------------------------
    def enqueue(self, sim: SimTrajectory, now: float) -> None:
        sim.queued_since = now
        sim.traj.state = TrajectoryState.QUEUED
        self.waiting[sim.id] = sim
        heapq.heappush(self._queue, (self.priority(sim.traj), sim.id))
        self._load_changed()

    def can_start_now(self) -> bool:
        """Would an arrival join the batch at the next iteration boundary?"""
        return len(self.running) < self.perf.batch_cap

    def release_cache(self, trajectory_id: str) -> int:
        """Drop a trajectory's idle cache; return its tokens."""
        entry = self.cache.pop(trajectory_id)
        if entry is None:
            return 0
        tokens, group_id, prompt_tokens = entry
        self.prompts.remove(group_id, prompt_tokens)
        return tokens

    def forget_idle(self) -> None:
        """Every idle cache goes (new weights void them; a retired pod takes them along)."""
        for tid in list(self.cache.tokens):
            self.release_cache(tid)
        self.pending_prefill_tokens = 0

    def warm(self, sim: SimTrajectory) -> None:
        """A migration imports a context: prefill it (next segment) and keep it cached.

        Its group's prompt, when a sibling holds it here, comes from the prefix cache.
        """
        self.pending_prefill_tokens += sim.traj.context_tokens - self._reusable(sim)
        self._cache_put(sim.traj, sim.traj.context_tokens)

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
            before = math.floor(self.clock + 1e-9)
            self.clock += n * seg.tokens_per_step
            gained = math.floor(self.clock + 1e-9) - before
            self.running_context += gained * len(self.running)
            self.generated_tokens += gained * len(self.running)
            if seg.draft_tokens:
                self.spec_steps += n * len(self.running)
                self.spec_tokens += n * len(self.running) * seg.tokens_per_step
            while (entry := self._live_end()) is not None and entry[0] <= self.clock + 1e-9:
                heapq.heappop(self._ends)
                done.append(self.running[entry[2]])
            # In the order they joined the batch: the order the running dict (an eager
            # scan) would list them in, which the events they cause are sequenced by.
            done.sort(key=lambda sim: sim.run_seq)
        for sim in done:
            self._stop(sim)
        if self.on_step_end is not None:
            for sim in done:
                self.on_step_end(self, sim, now)
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
                seg.batch,
                seg.context,
                self.instance.tp,
                decode_elapsed,
                seg.draft_tokens,
                seg.tokens_per_step,
            )
        iterations = min(seg.iterations, done + 1)
        if iterations >= seg.iterations:
            return None
        seg.iterations = iterations
        seg.end_s = (
            seg.start_s
            + seg.prefill_s
            + self.perf.segment_time(
                seg.batch,
                seg.context,
                self.instance.tp,
                iterations,
                seg.draft_tokens,
                seg.tokens_per_step,
            )
        )
        self.version += 1
        return seg.end_s

    def _admit(self, now: float) -> int:
        """Admit waiting steps by priority while a slot and KV are free; return prefill tokens."""
        cap = self.perf.batch_cap
        if self.draining or not self.waiting or len(self.running) >= cap:
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
            if len(self.running) >= cap:
                break
            context = sim.traj.context_tokens
            # Twice: evicting an idle sibling can take the group's prompt with it.
            if not (
                self._free_kv(context - self._reusable(sim), sim.id)
                and self._free_kv(context - self._reusable(sim), sim.id)
            ):
                break
            heapq.heappop(queue)
            del self.waiting[sim.id]
            reusable = self._reusable(sim)
            new_tokens = context - reusable
            sim.shared_prompt_tokens += reusable - min(self.release_cache(sim.id), context)
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

    def start_segment(self, now: float) -> float | None:
        """Admit, then plan the next segment; return its end (None when idle)."""
        if self.segment is not None:
            return self.segment.end_s
        prefill_tokens = self._admit(now) + self.pending_prefill_tokens
        self.pending_prefill_tokens = 0
        host_s, self.pending_host_s = self.pending_host_s, 0.0
        if not self.running:
            if prefill_tokens or host_s:
                duration = self.perf.prefill_time(prefill_tokens, self.instance.tp) + host_s
                self.segment = Segment(now, duration, 0, 0, 0, now + duration)
                self.version += 1
                return self.segment.end_s
            return None
        batch = len(self.running)
        context = self.running_context
        k, tau = (0, 1.0) if self.speculation is None else self.speculation(self, now)
        left = self._fewest_left()
        # At least one: after speculative segments the clock is fractional, and a plain
        # segment's step can end within one iteration (int() gave 0: an endless loop).
        iterations = max(1, math.ceil(left / tau - 1e-9))
        room = self.instance.kv_capacity_tokens - self.kv_used_tokens
        # The running batch's growth overflows the cache (idle caches give way when the
        # segment ends: relieve_kv_pressure); then stop where the idle ones must go.
        if iterations * batch * tau > room + self.cache.total:
            iterations = max(1, int(room // (batch * tau))) if room > 0 else 1
        prefill_s = self.perf.prefill_time(prefill_tokens, self.instance.tp) + host_s
        decode_s = self.perf.segment_time(batch, context, self.instance.tp, iterations, k, tau)
        self.segment = Segment(
            now, prefill_s, batch, context, iterations, now + prefill_s + decode_s, k, tau
        )
        self.version += 1
        return self.segment.end_s

    def relieve_kv_pressure(self, now: float) -> None:
        """Evict idle caches, then recompute-preempt the lowest-priority step, until growth fits."""
        while self.running:
            if self._free_kv(len(self.running)):
                return
            victim = max(self.running.values(), key=lambda s: (self.priority(s.traj), s.id))
            self._stop(victim)
            self.preemptions += 1
            self.enqueue(victim, now)  # its KV is gone: it recomputes on readmission


def interrupt_engine(engine: SimEngine, now: float) -> list[SimTrajectory]:
    """New weights reach ``engine`` at ``now``: stop its batch, forget every cached context.

    The running segment ends at its first iteration boundary after ``now``; the steps that
    finished in it are returned (the caller completes them). Every step still running is
    stopped and re-queued: its KV was computed by the old weights, so it recomputes its
    context under the new ones on readmission (what AReaL's interruptible generation, verl's
    fully-async partial rollout and slime's abort-and-resume do). The caller completes the
    finished steps, then calls :func:`drop_caches`.
    """
    done: list[SimTrajectory] = []
    seg = engine.segment
    if seg is not None:
        if now < seg.end_s:
            engine.cut_segment(now)
        done = engine.finish_segment(now)
    for sim in list(engine.running.values()):
        engine._stop(sim)
        engine.enqueue(sim, now)
    engine.version += 1  # the pending wake-up is void
    return done


def drop_caches(engine: SimEngine) -> None:
    """Forget every idle context: its KV came from weights the engine no longer holds."""
    engine.forget_idle()


def requeue(engine: SimEngine) -> None:
    """Rebuild the waiting queue from current priorities (they changed with the version)."""
    engine._queue = [(engine.priority(s.traj), s.id) for s in engine.waiting.values()]
    heapq.heapify(engine._queue)
