"""Speculative decoding in the simulator: what each engine's drafts are worth.

Only what a real vLLM worker can do is modelled: one method per engine
(``ngram`` or ``suffix``), K fixed or chosen by batch size, no per-request switch.
An engine's suffix tree holds the text of every request it served (vLLM keeps
up to 10,000 responses), so a request's siblings help only where they ran on the
same engine — for the baselines as for Heddle. The previous iteration's samples
of a task are where that iteration's routing put them, which no routing remembers:
each engine holds ``group_size / engines`` of them on average
(:func:`~heddle.scheduler.unseeded_history`), a group kept whole here as much as a
scattered one. More history is there only where the session inserted it.

Each segment (``SimEngine.start_segment``) asks :class:`EngineSpeculator` for the
batch's K and tokens per step; every running request then advances by the
batch's mean tokens per step (a fluid approximation within one engine: the
engine's throughput is exact for the model, the order in which its requests
finish is averaged).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from heddle.exceptions import ConfigError

from .._k_measured import MeasuredKTable
from .._perf import PerfModel
from .._placement import ClusterView, StickyPlacement
from .._speculation import (
    AUTO_MAX_K,
    SEED_S_PER_TOKEN,
    AcceptanceModel,
    SeedQuery,
    SpeculationConfig,
    auto_k_table,
    choose_k,
    seed_text_pays,
    unseeded_history,
)
from .._types import Trajectory
from .._workload import TrajectoryScript
from ._entities import SimEngine, SimTrajectory
from ._spec_plan import ColocationDecision, decide_colocation

_NONE: Final[frozenset[str]] = frozenset()  # no text served

# The worker keeps at most this many inserted texts per job and task
# (worker/_drafts.py, MAX_DRAFT_TEXTS_PER_TASK; the scheduler cannot import the worker).
MAX_SEEDED_PER_TASK: Final = 64
# Earlier samples of a task the session keeps and seeds: one GRPO group of the
# previous iteration (the acceptance model's history is measured with 16).
HISTORY_SAMPLES: Final = 16
# How long after a step returns its text the session has pushed it to the other engines
# (one batched POST /v1/drafts per engine per interval).
DRAFT_PUSH_INTERVAL_S: Final = 1.0

__all__ = [
    "DRAFT_PUSH_INTERVAL_S",
    "HISTORY_SAMPLES",
    "MAX_SEEDED_PER_TASK",
    "SEED_S_PER_TOKEN",
    "SPILL_MARGIN",
    "SPILL_RATIO",
    "EngineSpeculator",
    "GroupStickyPlacement",
    "SimSpeculation",
    "attach",
    "colocation_placement",
    "heddle_speculation",
    "make_speculator",
]


@dataclass(frozen=True)
class SimSpeculation:
    """A run's speculation: the engines' config, the acceptance model, and what only a
    trajectory scheduler adds (Heddle's runs; the baselines run stock vLLM):

    * ``colocate_groups``: Heddle may keep GRPO groups whole on one engine, where its
      decision (sim/_spec_plan.py) predicts that pays;
    * ``seed_siblings``: the session inserts each step's output into the suffix cache
      of every other engine that runs a member of its group (``POST /v1/drafts``),
      ``push_interval_s`` after the step returned it;
    * ``seed_history``: earlier iterations' outputs of the task (this many samples,
      kept per task id) are inserted into an engine before a group member first runs
      there;
    * ``k_table``: K from the batch-size table a worker started with ``auto`` builds
      (:func:`auto_k_table`), not per segment; ``k_measured``: that table rebuilt, per
      engine, from the acceptance the engine's segments gave (:class:`MeasuredKTable`,
      the object the worker runs), else fixed at the engine's start.

    Every inserted token costs its engine ``seed_s_per_token`` of loop time.
    ``pool_engines``: the engines the previous iteration spread a task's samples over,
    for the history an engine holds uninserted (None: this run's; a replica of a pool
    sets the pool's).

    Two settings for replaying a measured run (``heddle bench fidelity``):

    * ``k_by_batch_size``: the workers' own table ``((up_to_batch, K), ...)``, used
      where ``config`` has no fixed K (instead of the table Heddle's model would pick);
    * ``replayed``: tokens per decode step per trajectory id, from replaying the
      drafter over that trajectory's recorded tokens (heddle/bench/_spec_replay.py).
      A running request then advances by its own replayed figure, whatever the
      corpus and K the acceptance model would give (it ran at the real K already).
    """

    config: SpeculationConfig
    acceptance: AcceptanceModel
    colocate_groups: bool = False
    seed_siblings: bool = False
    seed_history: int = 0
    push_interval_s: float = DRAFT_PUSH_INTERVAL_S
    seed_s_per_token: float = SEED_S_PER_TOKEN
    k_table: bool = False
    k_measured: bool = False
    k_by_batch_size: tuple[tuple[int, int], ...] = ()
    replayed: Mapping[str, float] | None = None
    pool_engines: int | None = None

    @property
    def seeds(self) -> bool:
        return self.seed_siblings or self.seed_history > 0

    def unseeded(self) -> SimSpeculation:
        """The same speculation with nothing inserted (the co-location decision's
        candidate where a group's own engine already holds its siblings)."""
        return replace(self, seed_siblings=False, seed_history=0)


def heddle_speculation(
    config: SpeculationConfig,
    acceptance: AcceptanceModel,
    *,
    colocate_groups: bool = True,
    seed_siblings: bool = True,
    seed_history: int = HISTORY_SAMPLES,
    k_table: bool = True,
    k_measured: bool = True,
) -> SimSpeculation:
    """Heddle's drafting for a run (docs/speculation.md, "What a trajectory scheduler
    adds"): siblings' texts and the task's history seeded into every engine that runs a
    group member, K from a batch-size table rebuilt on the acceptance each engine
    measures, co-location only where it is judged to pay."""
    return SimSpeculation(
        config,
        acceptance,
        colocate_groups=colocate_groups,
        seed_siblings=seed_siblings,
        seed_history=seed_history,
        k_table=k_table,
        k_measured=k_table and k_measured,
    )


class EngineSpeculator:
    """``(K, tokens per step)`` for an engine's running batch; tracks what each engine's
    suffix cache holds (texts it served, and texts the session inserted)."""

    def __init__(
        self,
        spec: SimSpeculation,
        perf: PerfModel,
        group_sizes: Mapping[str, int] | None = None,
        history_tokens: Mapping[str, float] | None = None,
    ) -> None:
        self.spec = spec
        self.perf = perf
        # engine -> group -> trajectories whose text is in that engine's suffix tree
        self.served: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        # engine -> group -> {sibling: when its pushed text reached the engine's tree}
        self.pushed: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
        self.running_groups: dict[str, set[str]] = defaultdict(set)  # group -> engines
        self._last_groups: dict[str, set[str]] = {}  # engine -> groups it ran last segment
        self.history_tried: dict[str, set[str]] = defaultdict(set)  # engine -> groups decided
        # engine -> group -> when the feed asks about its history there (first step + push)
        self._history_due: dict[str, dict[str, float]] = defaultdict(dict)
        self.seeded_history: dict[str, set[str]] = defaultdict(set)  # engine -> groups seeded
        self._now = 0.0
        self.group_sizes = dict(group_sizes or {})
        self.history_tokens = dict(history_tokens or {})  # group -> tokens of its history
        self.seeded_tokens = 0.0  # tokens inserted into suffix caches (reports)
        self.seed_s = 0.0  # engine seconds those insertions cost
        self.k_steps: Counter[int] = Counter()  # segments started at each K (reports)
        self._tau: dict[tuple[int, int, float, float], float] = {}  # memo of the model
        self._unseeded_engines = 0  # the engine count _unseeded_of holds figures for
        self._unseeded_of: dict[str, float] = {}  # group -> _unseeded(group)
        self._tables: dict[int, tuple[tuple[int, int], ...]] = {}  # tp -> K by batch size
        self._engines: dict[str, SimEngine] = {}  # the engines it serves, by name
        self._last_k: dict[str, int] = {}  # engine -> K of its current segment
        self.measured: dict[str, MeasuredKTable] = {}  # engine -> its table (k_measured)
        self._counted: dict[str, tuple[float, float]] = {}  # engine -> (steps, tokens) fed
        self._built: dict[tuple[int, int, int, float, float], tuple[tuple[int, int], ...]] = {}

    def _tokens_per_step(self, k: int, siblings: int, history: float, position: float) -> float:
        key = (k, siblings, history, position)
        value = self._tau.get(key)
        if value is None:
            value = self.spec.acceptance.tokens_per_step(
                self.spec.config.method, k, siblings=siblings, history=history, position=position
            )
            self._tau[key] = value
        return value

    # -- the drafting corpus ------------------------------------------------------
    def _gain(
        self, engine: SimEngine, group: str, insert_tokens: float, siblings: int, history: int
    ) -> bool:
        """Does inserting this text into ``engine`` pay for ``group``'s requests there
        (:func:`seed_text_pays`, on the predictor's remaining lengths)?"""
        return self.pays(self.seed_query(engine, group, insert_tokens, siblings, history))

    def pays(self, query: SeedQuery) -> bool:
        """The seeding question (:func:`seed_text_pays`) at this run's acceptance and cost."""
        return seed_text_pays(
            self.perf,
            query,
            lambda k, s, h: self._tokens_per_step(k, s, h, 0.0),
            seconds_per_inserted_token=self.spec.seed_s_per_token,
        )

    def seed_query(
        self, engine: SimEngine, group: str, insert_tokens: float, siblings: int, history: int
    ) -> SeedQuery:
        """What the decision reads of ``engine`` now (the live feed builds the same)."""
        members = [s for s in engine.running.values() if s.traj.group_id == group]
        return SeedQuery(
            tp=engine.instance.tp,
            batch=len(engine.running),
            context_tokens=engine.running_context,
            # At the K the engine drafts with now (0: not drafting at this batch, no gain).
            k=self._last_k.get(engine.name, 0),
            insert_tokens=insert_tokens,
            members=len(members),
            remaining_tokens=sum(max(0.0, s.traj.predicted_remaining_tokens) for s in members),
            siblings_held=self._siblings_here(engine, group, self._now),
            siblings_after=siblings,
            history_held=self.spec.seed_history if group in self.seeded_history[engine.name] else 0,
            history_after=history,
            history_unseeded=self._unseeded(group),
        )

    def _unseeded(self, group: str) -> float:
        """The task's earlier samples an engine holds without insertions, on average."""
        table = self._unseeded_table()
        value = table.get(group)
        if value is None:
            value = unseeded_history(self.group_sizes.get(group, 1), self._unseeded_engines)
            table[group] = value
        return value

    def _unseeded_table(self) -> dict[str, float]:
        """group -> :meth:`_unseeded`, for the pool's engine count now (asked for every
        running group at every step: kept)."""
        engines = self.spec.pool_engines or len(self._engines)
        if engines != self._unseeded_engines:
            self._unseeded_engines, self._unseeded_of = engines, {}
        return self._unseeded_of

    def step_ended(self, engine: SimEngine, sim: SimTrajectory, now: float) -> None:
        """A step returned its text to the session, which pushes it, ``push_interval_s``
        later, to the other engines running the group where that pays."""
        self._now = now
        group = sim.traj.group_id
        turns = sim.script.turn_tokens
        step = sim.traj.turns  # the step that just ended (counted after this call)
        tokens = float(turns[step]) if step < len(turns) else 0.0
        for name in self.running_groups.get(group, ()):
            other = self._engines.get(name)
            if other is None or name == engine.name or sim.id in self.served[name][group]:
                continue
            pushed = self.pushed[name][group]
            if sim.id not in pushed:
                here = self._siblings_here(other, group, now)
                size = self.group_sizes.get(group, here + 2)
                text = float(sum(turns[: step + 1]))  # its whole text so far
                if not self._gain(other, group, text, min(here + 1, size - 1), 0):
                    continue
                pushed[sim.id] = now + self.spec.push_interval_s
                self._charge(name, text)
            else:
                self._charge(name, tokens)  # a sibling it holds: kept current

    def _siblings_here(self, engine: SimEngine, group: str, now: float) -> int:
        """Siblings whose text ``engine``'s tree holds: served there, or pushed and arrived."""
        name = engine.name
        return _siblings_held(
            self.served[name].get(group, _NONE), self.pushed[name].get(group), now
        )

    def _charge(self, engine_name: str, tokens: float) -> None:
        engine = self._engines.get(engine_name)
        if engine is None or tokens <= 0:
            return
        cost = tokens * self.spec.seed_s_per_token
        engine.pending_host_s += cost
        self.seeded_tokens += tokens
        self.seed_s += cost

    def register(self, engine: SimEngine) -> None:
        self._engines[engine.name] = engine

    def _corpus(self, engine: SimEngine, now: float) -> Counter[tuple[int, float, float]]:
        """Requests that draft alike, counted once each: (siblings, history, position).

        Asked at every step of every engine (the mini-simulations' CPU time, which the
        run is charged for, is mostly here): one pass over the batch, and the group's
        figures once per group."""
        self._now = now
        name = engine.name
        served = self.served[name]
        order: dict[str, None] = {}  # the running groups, in batch order
        for sim in engine.running.values():
            traj = sim.traj
            served[traj.group_id].add(traj.id)
            order[traj.group_id] = None
        groups = set(order)
        last = self._last_groups.get(name, _NONE)
        for group in last - groups:
            self.running_groups[group].discard(name)
        for group in groups - last:
            self.running_groups[group].add(name)
        self._last_groups[name] = groups
        self._seed_history(engine, now, order)
        seeded = self.seeded_history[name]
        pushed = self.pushed[name]
        # What a member drafts from is the same for its whole group on this engine:
        # (siblings, history), as _siblings_here and _unseeded say.
        drafting: dict[str, tuple[int, float]] = {}
        unseeded, seed_history = self._unseeded_table(), float(self.spec.seed_history)
        for group in order:
            siblings = _siblings_held(served[group], pushed.get(group), now)
            # The previous iteration's samples of the task: stock vLLM holds those its
            # routing happened to send here (group size / engines on average, kept
            # whole or not); inserted, all the session seeded.
            history = unseeded.get(group)
            if history is None:
                history = self._unseeded(group)
            if group in seeded and seed_history > history:
                history = seed_history
            drafting[group] = (siblings, history)
        kinds: Counter[tuple[int, float, float]] = Counter()
        for sim in engine.running.values():
            traj = sim.traj
            alike = drafting[traj.group_id]
            # The request's output position, rounded to a power of two (few kinds).
            n = traj.generated_tokens
            kinds[(alike[0], alike[1], float(1 << n.bit_length()) if n > 0 else 0.0)] += 1
        return kinds

    def _seed_history(self, engine: SimEngine, now: float, groups: Iterable[str]) -> None:
        """Once per task and engine, the session may insert the task's earlier outputs
        where that pays for the group's requests there. As the live feed does, it asks
        ``push_interval_s`` after the task's first step there (the feed sends at that
        interval), at the engine's batch then and the K of its last segment (at the
        first step the engine has no K yet and, at the run's start, a batch still
        filling); the texts draft from that segment on."""
        if self.spec.seed_history <= 0:
            return
        name = engine.name
        due = self._history_due[name]
        for group in groups:  # the running groups, in batch order
            if group in self.history_tried[name]:
                continue
            if now < due.setdefault(group, now + self.spec.push_interval_s):
                continue
            self.history_tried[name].add(group)
            tokens = self.history_tokens.get(group, 0.0)
            here = self._siblings_here(engine, group, now)
            if self._gain(engine, group, tokens, here, self.spec.seed_history):
                self._charge(name, tokens)
                self.seeded_history[name].add(group)

    # -- K ------------------------------------------------------------------------
    def _table_k(self, engine: SimEngine, batch: int) -> int:
        """K from the batch-size table a worker started with ``auto`` builds
        (:func:`auto_k_table`: on the acceptance it assumes, not the run's, which no
        worker knows when it starts); with ``k_measured``, rebuilt as the worker
        rebuilds it, from what this engine's drafts gave so far."""
        if self.spec.k_measured:
            return self._measured_table(engine).k_at(batch)
        tp = engine.instance.tp
        table = self._tables.get(tp)
        if table is None:
            config = self.spec.config
            table = auto_k_table(
                self.perf, tp, config.method, max_num_seqs=self.perf.batch_cap,
                max_k=config.num_speculative_tokens or AUTO_MAX_K,
            )  # fmt: skip
            self._tables[tp] = table
        return _k_at(table, batch)

    def _measured_table(self, engine: SimEngine) -> MeasuredKTable:
        """The engine's :class:`MeasuredKTable`, fed the request-steps and tokens of its
        segments since the last call (all at the K of its last segment)."""
        name = engine.name
        table = self.measured.get(name)
        if table is None:
            config = self.spec.config
            table = MeasuredKTable(
                self.perf, engine.instance.tp, config.method, max_num_seqs=self.perf.batch_cap,
                max_k=config.num_speculative_tokens or AUTO_MAX_K, cache=self._built,
            )  # fmt: skip
            self.measured[name] = table
        steps, tokens = self._counted.get(name, (0.0, 0.0))
        if engine.spec_steps > steps:
            table.record(
                self._last_k.get(name, 0), engine.spec_steps - steps, engine.spec_tokens - tokens
            )
            self._counted[name] = (float(engine.spec_steps), float(engine.spec_tokens))
        return table

    def __call__(self, engine: SimEngine, now: float) -> tuple[int, float]:
        config = self.spec.config
        if not config.enabled or not engine.running:
            return 0, 1.0
        kinds = self._corpus(engine, now)
        batch = len(engine.running)
        replayed = self.spec.replayed

        def tau(k: int) -> float:
            if replayed is not None:
                return sum(replayed.get(s.id, 1.0) for s in engine.running.values()) / batch
            total = 0.0
            for (siblings, history, position), n in kinds.items():
                total += n * self._tokens_per_step(k, siblings, history, position)
            return total / batch

        if config.num_speculative_tokens is not None:
            k = config.num_speculative_tokens
        elif self.spec.k_by_batch_size:
            k = _k_at(self.spec.k_by_batch_size, batch)
        elif self.spec.k_table:
            k = self._table_k(engine, batch)
        else:
            k = choose_k(self.perf, engine.instance.tp, batch, engine.running_context, tau)
        self.k_steps[k] += 1
        self._last_k[engine.name] = k
        return (k, tau(k)) if k else (0, 1.0)


def _siblings_held(served: Collection[str], pushed: Mapping[str, float] | None, now: float) -> int:
    """Siblings whose text an engine's tree holds: those it ``served`` and those
    ``pushed`` to it (sibling -> when the text arrives) that have arrived by ``now``."""
    # Most groups have nothing pushed to most engines: the sum only where there is.
    arrived = sum(1 for t, at in pushed.items() if at <= now and t not in served) if pushed else 0
    return max(0, len(served) + arrived - 1)


def _k_at(table: Sequence[tuple[int, int]], batch: int) -> int:
    """K for ``batch`` running sequences from ``((up_to_batch, K), ...)``; past the last
    row, its K."""
    for up_to, k in table:
        if batch <= up_to:
            return k
    return table[-1][1] if table else 0


# A step of a kept-whole group leaves its engine for the least loaded one once its
# engine holds this many more requests (docs/speculation.md, "Kept whole until the
# tail"): at 2,048 and 8,192 trajectories, 4, 8 and 16 all beat groups held whole.
SPILL_MARGIN: Final = 8
# ... and this many times as many (an idle engine counts as 1): a full batch's usual
# spread of a few requests never moves a step.
SPILL_RATIO: Final = 2.0


class GroupStickyPlacement(StickyPlacement):
    """verl's sticky placement with GRPO groups kept whole, until the tail.

    A trajectory's first step goes where its group's first went (the least loaded
    engine for a new group), so the group's text shares one suffix tree and its
    prompt one prefix cache. A later step stays where its trajectory ran unless that
    engine holds ``spill_margin`` more requests than the least loaded and
    ``spill_ratio`` times as many (an idle engine counts as 1): then it goes there and
    re-prefills its context. Kept whole, where the long groups land sets the
    makespan (at 8,192 trajectories on 64 GPUs a perturbation of the tool latencies
    under 0.1% moved coding by a fifth); spilled, an engine left with long groups
    hands their steps to the engines that ran short ones. ``spill_margin=None``:
    groups stay whole to the end.
    """

    name = "group-sticky"

    def __init__(
        self,
        assignment: Mapping[str, str] | None = None,
        *,
        spill_margin: int | None = SPILL_MARGIN,
        spill_ratio: float = SPILL_RATIO,
    ) -> None:
        if spill_margin is not None and spill_margin < 1:
            raise ConfigError(f"spill_margin={spill_margin} must be at least 1 (None: never)")
        if spill_ratio < 1.0:
            raise ConfigError(f"spill_ratio={spill_ratio} must be at least 1.0")
        self._group_engine: dict[str, str] = dict(assignment or {})
        self.spill_margin = spill_margin
        self.spill_ratio = spill_ratio

    def route(self, trajectory: Trajectory, view: ClusterView) -> str:
        here = trajectory.instance
        if not view.has(here):
            return self.first_step(trajectory, view)
        assert here is not None
        if self.spill_margin is not None:
            least = view.least_loaded()
            load, lowest = view.load.get(here, 0), view.load.get(least, 0)
            if load - lowest >= self.spill_margin and load >= self.spill_ratio * max(lowest, 1):
                return least
        return here

    def first_step(self, trajectory: Trajectory, view: ClusterView) -> str:
        # Never spilled: a group's members start together, and spilling them would
        # scatter the group before its siblings wrote any text.
        engine = self._group_engine.get(trajectory.group_id)
        if engine is None or not view.has(engine):
            engine = view.least_loaded()
            self._group_engine[trajectory.group_id] = engine
        return engine


def make_speculator(
    spec: SimSpeculation, perf: PerfModel, scripts: Sequence[TrajectoryScript]
) -> EngineSpeculator:
    """The speculator for a run over ``scripts``: group sizes (how many siblings there
    are to seed), the tokens a group's history texts hold (its outputs: the previous
    iteration's are taken to be as long as this one's, for what inserting them costs)."""
    sizes: Counter[str] = Counter()
    history: dict[str, float] = defaultdict(float)
    for s in scripts:
        sizes[s.group_id] += 1
        history[s.group_id] += s.total_tokens
    if spec.seed_history:
        # ``seed_history`` samples of the task, each as long as this iteration's mean.
        for g, total in history.items():
            history[g] = total / sizes[g] * min(spec.seed_history, MAX_SEEDED_PER_TASK)
    return EngineSpeculator(spec, perf, sizes, history)


def attach(engines: Iterable[SimEngine], speculator: EngineSpeculator | None) -> None:
    for engine in engines:
        engine.speculation = speculator
        if speculator is not None:
            speculator.register(engine)
            if speculator.spec.seed_siblings:
                engine.on_step_end = speculator.step_ended


def colocation_placement(
    trajectories: Sequence[Trajectory],
    engines: int,
    tp: int,
    spec: SimSpeculation,
    perf: PerfModel,
    *,
    replica: int = 1,
    simulate: Callable[[Sequence[tuple[bool, bool]]], list[float]] | None = None,
) -> tuple[GroupStickyPlacement | None, ColocationDecision]:
    """Heddle's decision (:func:`decide_colocation`) on the predictor's lengths, for a pool
    of ``engines`` engines at TP ``tp``: a group-keeping placement (None: groups are not
    kept whole) and the verdict (why, and whether the run still seeds texts)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        groups[t.group_id].append(max(1.0, t.predicted_remaining_tokens))
    model, config = spec.acceptance, spec.config
    k = config.num_speculative_tokens or 4  # the decision's reference K for ``auto``
    size = max(len(v) for v in groups.values())
    per_engine = max(1, engines)
    scattered = max(0, round(size / per_engine) - 1)
    # Earlier samples: inserted where the run seeds them, else the pool's average share
    # (kept whole or scattered alike: the previous iteration's homes are not remembered).
    history = float(size) if spec.seed_history else unseeded_history(size, per_engine)
    co = model.tokens_per_step(config.method, k, siblings=size - 1, history=history)
    sc = model.tokens_per_step(config.method, k, siblings=scattered, history=history)
    per_token = perf.instance("probe", tp).per_token_s
    decision = decide_colocation(
        groups,
        per_engine,
        per_token,
        co,
        sc,
        siblings_seeded=spec.seed_siblings,
        replica=replica,
        simulate=simulate,
        seeds=spec.seeds,
    )
    if not decision.colocate:
        return None, decision
    # Where each group goes is decided when its first trajectory starts (the least
    # loaded engine then), which follows the real load rather than the predicted one.
    return GroupStickyPlacement(), decision
