"""The discrete-event rollout simulator: one policy, one workload, one cluster."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from heddle.exceptions import ConfigError, HeddleError

from .._cluster import ClusterSpec
from .._migration import Move, NoMigration
from .._perf import EngineInstance, PerfModel
from .._placement import ClusterView, DPPlacement, PlacementPlan, PlacementPolicy
from .._policies import (
    SchedulingPolicy,
    get_policy,
    make_migration,
    make_ordering,
    make_placement,
    make_predictor,
)
from .._predictor import LengthPredictor, OraclePredictor
from .._replan import DrainingEngine, ReplanState, decide_replan
from .._reshape import Merge, TailMergeConfig, TailMergePlanner
from .._shape import ShapeConfig
from .._types import FinishedTrajectory, PoolShape, Trajectory, TrajectoryState
from .._workload import TrajectoryScript
from ._entities import SimEngine, SimTrajectory
from ._minis import DECISION_WORKERS, Wave, wave_events, wave_workers
from ._plan import (
    ReplicaRun,
    ReplicaShapePlanner,
    group_replica,
    replica_scale,
    shrink_shape,
    workload_sketch,
)
from ._results import SimResult, summarise
from ._spec_plan import ColocationDecision
from ._speculation import (
    EngineSpeculator,
    GroupStickyPlacement,
    SimSpeculation,
    attach,
    colocation_placement,
    make_speculator,
)
from ._view import LiveClusterView

__all__ = [
    "InlineRunner",
    "MiniRun",
    "MiniRunner",
    "PlannerCost",
    "SimConfig",
    "SimulatedShapePlanner",
    "Simulator",
    "judge_colocation",
    "run_mini",
]

_WAKE, _TOOL, _MIGRATED, _REPLAN, _ARRIVE, _PLANNED, _READY, _MERGED = range(8)
_EVENT_NAMES = ("wake", "tool", "migrated", "replan", "arrive", "planned", "ready", "merged")


@dataclass(frozen=True)
class PlannerCost:
    """The CPU seconds Heddle's planner calls take, charged in simulated time.

    The session runs the placement DP and the migration planner on its one event
    loop, so while they run no step is routed and no tool result is handled; the
    plan and its moves take effect when they return. The simulator charges that
    time from this model, not from a clock, so a run stays reproducible:
    placement ``placement_fixed_s + placement_per_trajectory_s * n +
    placement_per_engine_s * engines`` for ``n`` trajectories planned, and
    migration ``migration_per_trajectory_s * n`` for ``n`` considered. The
    constants are a least-squares fit of ``time.process_time()`` around
    ``DPPlacement.replan`` and ``ToolWindowMigration.plan`` on 1,024 to 32,768
    trajectories over 16, 64 and 256 engines (2-core x86 VM, Python 3.11,
    numpy 2; docs/simulator.md, "Scheduler CPU time"); each point lies within
    25% of its fit above 5 ms.
    """

    placement_fixed_s: float = 5e-4
    placement_per_trajectory_s: float = 1.1e-6
    placement_per_engine_s: float = 1.4e-5
    migration_per_trajectory_s: float = 1.4e-6
    # The start-up decisions (the shape planner's replicas, the co-location verdict) run
    # mini-simulations before the first step is routed: this much CPU per event they
    # handle (``time.process_time()`` over events, Heddle's runs on four workloads at
    # 2,048 and 8,192 trajectories: plain decode 22-28 us, median 24.5; speculating,
    # where each step also groups its batch by what it drafts from, 68-106 us, median
    # 80; docs/simulator.md).
    simulated_event_s: float = 2.5e-5
    speculating_event_s: float = 8e-5
    # Each decision's simulations run side by side on this many processes (the live
    # session's, DECISION_WORKERS; sim/_minis.py): a wave takes its longest worker's
    # events, and starting the workers, once, ``worker_start_s`` (measured with
    # rollout's ProcessRunner, docs/simulator.md).
    decision_workers: int = DECISION_WORKERS
    worker_start_s: float = 0.5

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"PlannerCost.{name}={value} must be a finite number >= 0")
        if self.decision_workers < 1:
            raise ConfigError(f"PlannerCost.decision_workers={self.decision_workers} must be >= 1")

    def placement_s(self, trajectories: int, engines: int) -> float:
        return (
            self.placement_fixed_s
            + self.placement_per_trajectory_s * trajectories
            + self.placement_per_engine_s * engines
        )

    def migration_s(self, trajectories: int) -> float:
        return self.migration_per_trajectory_s * trajectories

    def decisions_s(self, waves: Sequence[Wave], *, speculating: bool = False) -> float:
        """The time the decisions' ``waves`` take, one after another."""
        rate = self.speculating_event_s if speculating else self.simulated_event_s
        started = any(w.workers > 1 for w in waves)
        return rate * sum(wave_events(w) for w in waves) + (self.worker_start_s if started else 0.0)


@dataclass(frozen=True)
class SimConfig:
    """Knobs of a simulation run; times in seconds."""

    replan_interval_s: float = 5.0  # how often Heddle re-plans placement and migrations
    initial_reshape_s: float = 0.0  # extra start-up cost of a non-baseline shape (see docs)
    quality_steps: tuple[int, ...] = (1, 2, 4)  # steps at which predictor quality is scored
    max_events: int = 50_000_000  # a guard against a scheduling bug looping forever
    trace: bool = False  # record every handled event in Simulator.trace (tests, debugging)
    # At most this many trajectories in flight per engine (None: all at once); the rest
    # start, in task order, as others finish. A knob verl's and slime's users turn
    # (rollout concurrency) so that fewer contexts fight for the KV cache.
    max_trajectories_per_engine: int | None = None
    # The planner's own CPU time delays what it decides (None: plans take no time, as
    # before issue 14). Only policies that run the DP or the migration planner pay it.
    planner_cost: PlannerCost | None = PlannerCost()
    # When and at what cost a policy with a dynamic shape merges engines for the tail.
    tail_merge: TailMergeConfig = field(default_factory=TailMergeConfig)
    # Speculative decoding on every engine (sim/_speculation.py); None: plain decode.
    speculation: SimSpeculation | None = None
    # A GRPO group's prompt held once per engine, as vLLM's prefix cache shares it
    # (sim/_entities.py); False: each context holds and prefills its own, the model
    # before 2026-11-26 (the pinned runs of tests/scheduler/sim/test_recorded_runs.py).
    shared_prompts: bool = True

    def __post_init__(self) -> None:
        if self.replan_interval_s <= 0:
            raise ConfigError(f"replan_interval_s={self.replan_interval_s} must be > 0")
        if self.max_trajectories_per_engine is not None and self.max_trajectories_per_engine < 1:
            raise ConfigError(
                f"max_trajectories_per_engine={self.max_trajectories_per_engine} must be >= 1"
            )
        if self.initial_reshape_s < 0:
            raise ConfigError(f"initial_reshape_s={self.initial_reshape_s} must be >= 0")


class Simulator:
    """Runs a workload's trajectory scripts on a simulated cluster under one policy.

    ``history`` (an earlier rollout's finished trajectories) seeds the
    predictor and, for adaptive policies, the initial TP shape.
    ``tool_means_s`` gives the expected latency of each tool, which is what the
    scheduler knows about a running tool call (the script holds the truth).
    ``shape`` pins the pool's TP mix (a benchmark's homogeneous TP sweep);
    otherwise adaptive policies plan it and the others run the cluster's
    baseline shape. ``perf`` replaces the cluster's performance model (the
    shape planner's mini-simulations, which cost a pool described by a
    :class:`PerfModel` rather than by presets).
    """

    def __init__(
        self,
        scripts: Sequence[TrajectoryScript],
        cluster: ClusterSpec,
        policy: SchedulingPolicy,
        *,
        tool_means_s: Mapping[str, float],
        history: Sequence[FinishedTrajectory] = (),
        config: SimConfig | None = None,
        predictor: LengthPredictor | None = None,
        shape: PoolShape | None = None,
        perf: PerfModel | None = None,
    ) -> None:
        if not scripts:
            raise ConfigError("the workload has no trajectories to simulate")
        self.config = config or SimConfig()
        self.cluster = cluster
        self.policy = policy
        self.perf = perf if perf is not None else cluster.perf_model()
        self.ordering = make_ordering(policy.ordering)
        self.placement = make_placement(policy.placement)
        self.migration = make_migration(policy.migration, self.perf)
        self.predictor = predictor
        truth = {s.id: (s.total_tokens, s.turns) for s in scripts}
        if self.predictor is None and policy.predictor == OraclePredictor.name:
            self.predictor = OraclePredictor(lambda t: truth[t.id])
        elif self.predictor is None and policy.predictor:
            self.predictor = make_predictor(policy.predictor)
        if self.predictor is not None and history:
            self.predictor.seed(history)
        self.tool_means_s = dict(tool_means_s)
        self.sims = {
            s.id: SimTrajectory(s, Trajectory(s.id, s.group_id, s.prompt_tokens)) for s in scripts
        }
        if shape is not None and shape.gpus > cluster.gpus:
            raise ConfigError(
                f"shape {shape} uses {shape.gpus} GPUs; the cluster has {cluster.gpus}"
            )
        # The start-up decisions' mini-simulations, wave by wave (charged in run()).
        self.decision_waves: list[Wave] = []
        self.decisions_s = 0.0  # simulated seconds they were charged
        # The planner's verdict: a step-centric policy to run instead (see _initial_shape).
        self.fallback_policy: str | None = None
        if shape is not None:
            self.shape = shape
        else:
            self.shape, self.fallback_policy = self._initial_shape(history)
        self._replans = self.policy.migration != "none" or self.policy.placement == "presorted-dp"
        # The dynamic resource manager: it runs whatever scheduling runs (a fallback too).
        self._merger = (
            TailMergePlanner(
                self.perf,
                cluster.tensor_parallel_sizes,
                cluster.gpus_per_node,
                self.config.tail_merge,
            )
            if policy.dynamic_shape
            else None
        )
        if self.fallback_policy is not None:
            fallback = get_policy(self.fallback_policy)
            self.ordering = make_ordering(fallback.ordering)
            self.placement = make_placement(fallback.placement)
            self.migration = make_migration(fallback.migration, self.perf)
            self._replans = fallback.migration != "none" or fallback.placement == "presorted-dp"
        self._replans = self._replans or self._merger is not None
        self.reshaped = shape is None and self.shape != cluster.baseline_shape()
        cost = self.config.planner_cost
        self._placement_cost = cost if isinstance(self.placement, DPPlacement) else None
        self._migration_cost = cost if not isinstance(self.migration, NoMigration) else None
        self.engines: dict[str, SimEngine] = {}
        self._counter = itertools.count()
        for tp in self.shape.tps():
            inst = self.perf.instance(f"tp{tp}-{next(self._counter)}", tp)
            self._check_fits(inst)
            self.engines[inst.name] = SimEngine(
                inst, self.perf, self.ordering.priority, self.config.shared_prompts
            )
        self.speculator: EngineSpeculator | None = None
        self.colocation: str = "off"  # the co-location decision, for the report
        spec = self.config.speculation
        if spec is not None and spec.config.enabled:
            if spec.colocate_groups:
                self.placement, self.colocation, seed = self._decide_colocation(history)
                if not seed:  # kept whole, the groups ran faster without insertions
                    self.config = replace(self.config, speculation=spec.unseeded())
            self.speculator = make_speculator(self.config.speculation or spec, self.perf, scripts)
            attach(self.engines.values(), self.speculator)
        # Engines being merged (no new steps; they empty) and those gone: out of the view.
        self._draining: set[str] = set()
        self._retired: set[str] = set()
        self._merge: Merge | None = None
        self.merges: list[tuple[float, float, Merge]] = []  # (drain started, served, merge)
        self.retired_at: dict[str, float] = {}  # engine -> when its GPUs were freed
        self._live_view = self._build_view()
        self._events: list[tuple[float, int, int, str, int]] = []
        self._seq = itertools.count()
        self._moving: set[str] = set()  # engines sending or receiving a move
        self._move_of: dict[str, Move] = {}
        self._arriving: dict[str, str] = {}  # trajectory -> engine its step is on its way to
        self._finished = 0
        # Unfinished trajectories in workload order: a re-plan reads them without a scan
        # of every trajectory ever started.
        self._unfinished: dict[str, SimTrajectory] = dict(self.sims)
        self._not_started: list[SimTrajectory] = []  # past the in-flight cap, reversed order
        self.migrations = 0
        self.replans = 0
        self.planner_s = 0.0  # simulated seconds charged for the planner's CPU time
        # The session's loop is busy planning until then: tool results, routing and the
        # landing of moves wait; engines keep running.
        self._busy_until = 0.0
        self._pending: tuple[PlacementPlan | None, list[Move]] | None = None
        self.trace: list[tuple[float, str, str]] = []  # (time, event, engine or trajectory)

    # -- set-up ------------------------------------------------------------------
    def _initial_shape(self, history: Sequence[FinishedTrajectory]) -> tuple[PoolShape, str | None]:
        """The planned shape, and the step-centric policy to run instead (or None)."""
        baseline = self.cluster.baseline_shape()
        if not self.policy.adaptive_shape:
            return baseline, None
        records = list(history)
        if not records:  # no earlier rollout: plan for the predictor's prior
            for sim in self.sims.values():
                self._predict(sim)
            records = [FinishedTrajectory.predicted(s.traj) for s in self.sims.values()]
        config = ShapeConfig(
            gpu_budget=self.cluster.gpus,
            gpus_per_node=self.cluster.gpus_per_node,
            tensor_parallel_sizes=self.cluster.tensor_parallel_sizes,
            reshape_s=self.config.initial_reshape_s,
        )
        planner = SimulatedShapePlanner(
            self.perf, config, speculation=self.config.speculation, runner=self._runner()
        )
        plan = planner.plan_history(
            records, baseline, tool_means_s=self.tool_means_s, policy=self.policy.name
        )
        self.decision_waves += planner.waves
        if plan.fallback_policy is not None and self.config.max_trajectories_per_engine is None:
            self.config = replace(
                self.config, max_trajectories_per_engine=plan.max_trajectories_per_engine
            )
        return plan.shape, plan.fallback_policy

    def _runner(self) -> InlineRunner:
        """The decisions' simulations run here, recorded as the live session runs them."""
        cost = self.config.planner_cost
        return InlineRunner(cost.decision_workers if cost is not None else 1)

    @property
    def decision_events(self) -> int:
        """Events the start-up decisions' mini-simulations handled (their CPU)."""
        return sum(sum(w.events) for w in self.decision_waves)

    def _decide_colocation(
        self, history: Sequence[FinishedTrajectory]
    ) -> tuple[PlacementPolicy, str, bool]:
        """Keep GRPO groups whole only where a simulation of the pool under the routing
        in effect, with speculation, says it pays (:func:`judge_colocation`): the
        placement, the verdict, and whether texts are still seeded."""
        assert self.config.speculation is not None
        for sim in self.sims.values():
            self._predict(sim)
        records = list(history) or [
            FinishedTrajectory.predicted(s.traj) for s in self.sims.values()
        ]
        placement, verdict = judge_colocation(
            [s.traj for s in self.sims.values()],
            records,
            cluster=self.cluster,
            policy=self.fallback_policy or self.policy.name,
            shape=self.shape,
            perf=self.perf,
            config=self.config,
            tool_means_s=self.tool_means_s,
            predictor=self.policy.predictor,
            runner=self._runner(),
        )
        kept = placement if placement is not None else self.placement
        self.decision_waves += verdict.waves
        return kept, verdict.reason, verdict.seed

    def _check_fits(self, inst: EngineInstance) -> None:
        """Every trajectory's whole context must fit an engine's KV cache on its own."""
        longest = max(
            s.script.prompt_tokens + s.script.total_tokens + sum(s.script.tool_output_tokens)
            for s in self.sims.values()
        )
        if inst.kv_capacity_tokens < longest:
            raise ConfigError(
                f"{self.perf.model.name} at TP{inst.tp} holds {inst.kv_capacity_tokens} KV tokens "
                f"but a trajectory of this workload reaches {longest}; use a larger TP "
                "(baseline_tp, tensor_parallel_sizes) or a smaller output_tokens.max"
            )

    # -- events ------------------------------------------------------------------
    def _push(self, when: float, kind: int, key: str, version: int = 0) -> None:
        heapq.heappush(self._events, (when, next(self._seq), kind, key, version))

    def _kick(self, engine: SimEngine, now: float, arrival: bool) -> None:
        if engine.segment is None:
            end = engine.start_segment(now)
            if end is not None:
                self._push(end, _WAKE, engine.name, engine.version)
        elif arrival and engine.can_start_now():
            cut = engine.cut_segment(now)
            if cut is not None:
                self._push(cut, _WAKE, engine.name, engine.version)

    def _view(self) -> ClusterView:
        return self._live_view

    def _build_view(self) -> LiveClusterView:
        """The serving engines as placement sees them, kept current by the engines' loads."""
        out = self._draining | self._retired
        view = LiveClusterView([e for n, e in self.engines.items() if n not in out])
        for engine in self.engines.values():
            engine.on_load_change = view.update
        return view

    # -- the dynamic resource manager ------------------------------------------------------
    def _consider_merge(self, now: float) -> None:
        """At a re-plan: start draining a pair of engines if the tail merits a merge."""
        if self._merger is None or self._merge is not None:
            return
        serving = {i.name: i.tp for i in self._live_view.instances}
        live = [s.traj for s in self._unfinished.values()]
        merge = self._merger.plan(TailMergePlanner.snapshots(serving, live))
        if merge is None:
            return
        self._merge = merge
        self._draining.update(merge.engines)
        self._live_view = self._build_view()
        self.merges.append((now, math.nan, merge))
        for name in merge.engines:
            self._maybe_retire(self.engines[name], now)

    def _maybe_retire(self, engine: SimEngine, now: float) -> None:
        """A draining engine with nothing left to run goes; the last one frees the GPUs."""
        name = engine.name
        if name not in self._draining or engine.load or engine.segment is not None:
            return
        if name in self._moving or engine.pending_prefill_tokens:
            return
        self._draining.discard(name)
        self._retired.add(name)
        self.retired_at[name] = now
        engine.forget_idle()  # its prefix cache goes with the pod
        merge = self._merge
        assert merge is not None
        if not any(n in self._draining for n in merge.engines):
            self._push(now + self.config.tail_merge.reshape_s, _MERGED, "")

    def _merged(self, now: float) -> None:
        """The merged engine is up (pod restarted, weights loaded): it serves from now."""
        merge = self._merge
        assert merge is not None
        inst = self.perf.instance(f"tp{merge.tp}-{next(self._counter)}", merge.tp)
        self.engines[inst.name] = SimEngine(
            inst, self.perf, self.ordering.priority, self.config.shared_prompts
        )
        attach([self.engines[inst.name]], self.speculator)
        self._live_view = self._build_view()
        started, _, _ = self.merges[-1]
        self.merges[-1] = (started, now, merge)
        self._merge = None

    def _predict(self, sim: SimTrajectory) -> None:
        if self.predictor is not None:
            self.predictor.update(sim.traj)

    # -- the agent loop ---------------------------------------------------------------
    def _dispatch(self, sim: SimTrajectory, now: float) -> None:
        if now < self._busy_until:
            self._push(self._busy_until, _READY, sim.id)  # routed once the plan is done
            return
        sim.start_turn()
        sim.traj.ready_s = now
        engine = self.engines[self.placement.route(sim.traj, self._view())]
        if self.perf.step_overhead_s > 0:
            # A measured engine's request spends this long outside it before it can join a
            # batch (HTTP, the worker's handling); the datasheet model has no such delay.
            sim.traj.state = TrajectoryState.QUEUED
            self._arriving[sim.id] = engine.name
            engine.arriving += 1  # counted in its load at once, as the session counts it
            self._push(now + self.perf.step_overhead_s, _ARRIVE, sim.id)
            return
        engine.enqueue(sim, now)
        self._kick(engine, now, arrival=True)

    def _arrive(self, sim: SimTrajectory, now: float) -> None:
        engine = self.engines[self._arriving.pop(sim.id)]
        engine.arriving -= 1
        engine.enqueue(sim, now)
        self._kick(engine, now, arrival=True)

    def _step_done(self, sim: SimTrajectory, engine: SimEngine, now: float) -> None:
        traj, script = sim.traj, sim.script
        traj.turn_tokens.append(script.turn_tokens[traj.turns])
        traj.turns += 1
        if traj.turns == script.turns:
            traj.state = TrajectoryState.DONE
            traj.predicted_remaining_tokens = 0.0
            sim.finish_s = now
            self._finished += 1
            del self._unfinished[sim.id]
            if self.predictor is not None:
                self.predictor.finish(traj)
            if self._not_started:
                self._dispatch(self._not_started.pop(), now)
            return
        engine.keep(sim)
        tool = script.tool_names[traj.turns - 1]
        traj.state = TrajectoryState.IN_TOOL
        traj.tool_calls += 1
        # The agent issues the call when the session's loop is free (at once unless planning).
        called = max(now, self._busy_until)
        traj.tool_expected_end_s = called + self.tool_means_s.get(tool, 0.0)
        self._predict(sim)
        if traj.turns in self.config.quality_steps:
            sim.predicted_total_at_step[traj.turns] = traj.predicted_total_tokens
        self._push(called + script.tool_latency_s[traj.turns - 1], _TOOL, sim.id)

    def _tool_done(self, sim: SimTrajectory, now: float) -> None:
        sim.traj.context_tokens += sim.script.tool_output_tokens[sim.traj.turns - 1]
        sim.traj.tool_expected_end_s = None
        if sim.migrating_to is not None:
            sim.tool_done = True  # resumes once the move lands
            return
        self._dispatch(sim, now)

    def _replan_state(self, now: float) -> ReplanState:
        """The simulator's state as the re-plan decision sees it."""
        live = [s.traj for s in self._unfinished.values()]
        movable = [t for t in live if self.sims[t.id].migrating_to is None]
        draining = {
            n: DrainingEngine(self.engines[n].instance, self.engines[n].load)
            for n in sorted(self._draining)
        }
        return ReplanState(live, movable, self._view(), now, draining, frozenset(self._moving))

    def _replan(self, now: float) -> float:
        """Plan on the state at ``now``; return the CPU seconds charged for it."""
        self.replans += 1
        if not self._unfinished:
            return 0.0
        state = self._replan_state(now)
        spent = 0.0
        if self._placement_cost is not None:
            spent += self._placement_cost.placement_s(len(state.live), len(state.view.instances))
        if self._migration_cost is not None:
            spent += self._migration_cost.migration_s(len(state.movable))
        # With a CPU cost the plan is computed now and adopted when the planner returns;
        # the moves aim at the new plan.
        decision = decide_replan(state, self.placement, self.migration, defer=spent > 0)
        if spent <= 0:
            for move in decision.moves:
                self._start_move(move, now)
            return 0.0
        self.planner_s += spent
        self._busy_until = max(self._busy_until, now + spent)
        self._pending = (decision.deferred_plan, list(decision.moves))
        self._push(now + spent, _PLANNED, "")
        return spent

    def _planned(self, now: float) -> None:
        """The planner returned: adopt its plan, start its moves that still make sense."""
        assert self._pending is not None
        plan, moves = self._pending
        self._pending = None
        if plan is not None:
            assert isinstance(self.placement, DPPlacement)
            self.placement.adopt(plan)
        for move in moves:
            sim = self.sims[move.trajectory_id]
            if (
                sim.traj.state is TrajectoryState.IN_TOOL
                and sim.migrating_to is None
                and sim.traj.instance == move.source
                and move.source not in self._moving
                and move.destination not in self._moving
                and self._live_view.has(move.destination)
            ):
                self._start_move(move, now)

    def _start_move(self, move: Move, now: float) -> None:
        sim = self.sims[move.trajectory_id]
        self.engines[move.source].release_cache(sim.id)
        destination = self.engines[move.destination]
        destination.warm(sim)
        self._kick(destination, now, arrival=False)
        sim.migrating_to = move.destination
        sim.migrations += 1
        self.migrations += 1
        self._moving.update((move.source, move.destination))
        self._move_of[sim.id] = move
        self._push(now + move.cost_s, _MIGRATED, sim.id)

    def _migrated(self, sim: SimTrajectory, now: float) -> None:
        move = self._move_of.pop(sim.id)
        self._moving.difference_update((move.source, move.destination))
        sim.traj.instance = move.destination
        sim.migrating_to = None
        self._maybe_retire(self.engines[move.source], now)
        if sim.tool_done:
            sim.tool_done = False
            self._dispatch(sim, now)

    # -- the run ---------------------------------------------------------------------
    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Simulate until every trajectory finishes; ``progress(done, total)`` as they do."""
        start = self.config.initial_reshape_s if self.reshaped else 0.0
        cost = self.config.planner_cost
        if cost is not None and self.decision_waves:
            # The session routes nothing until its shape and co-location are decided.
            # Its mini-simulations speculate as the run does (the planner's, the verdict's).
            spec = self.config.speculation
            speculating = spec is not None and spec.config.enabled
            self.decisions_s = cost.decisions_s(self.decision_waves, speculating=speculating)
            self.planner_s += self.decisions_s
            start += self.decisions_s
        sims = list(self.sims.values())
        for sim in sims:
            self._predict(sim)
        view = self._view()
        self.placement.replan([s.traj for s in sims], view)
        if self._placement_cost is not None:
            # The first steps are routed once the first plan is done.
            spent = self._placement_cost.placement_s(len(sims), len(view.instances))
            self.planner_s += spent
            start += spent
            self._busy_until = start
        cap = self.config.max_trajectories_per_engine
        first = sims if cap is None else sims[: cap * len(self.engines)]
        self._not_started = sims[len(first) :][::-1]
        for sim in first:
            self._dispatch(sim, start)
        if self._replans:
            self._push(start + self.config.replan_interval_s, _REPLAN, "")
        total = len(sims)
        _, events = self._run_events(
            start,
            lambda: self._finished,
            total,
            lambda now: (
                f"simulation stalled at t={now:.1f}s with {total - self._finished} "
                "trajectories unfinished; this is a bug in a policy or the simulator"
            ),
            progress,
        )
        return summarise(self, events)

    def _run_events(
        self,
        now: float,
        done: Callable[[], int],
        total: int,
        stalled: Callable[[float], str],
        progress: Callable[[int, int], None] | None,
    ) -> tuple[float, int]:
        """Handle events in time order until ``done()`` reaches ``total``.

        Returns the time then and the events handled; ``progress(done, total)`` as
        ``done()`` changes. ``stalled(now)`` says why running out of events first is a bug.
        The one event loop of this simulator and its subclasses (they add events
        through :meth:`_handle`).
        """
        events, reported = 0, -1
        while done() < total:
            if not self._events:
                raise HeddleError(stalled(now))
            now, _, kind, key, version = heapq.heappop(self._events)
            events += 1
            if self.config.trace:
                self.trace.append((now, self._event_name(kind), key))
            if events > self.config.max_events:
                raise HeddleError(f"simulation exceeded {self.config.max_events} events")
            self._handle(now, kind, key, version)
            if progress is not None and done() != reported:
                reported = done()
                progress(reported, total)
        return now, events

    def _event_name(self, kind: int) -> str:
        return _EVENT_NAMES[kind]

    def _handle(self, now: float, kind: int, key: str, version: int) -> None:
        if kind == _WAKE:
            engine = self.engines[key]
            if version != engine.version:
                return
            for sim in engine.finish_segment(now):
                self._step_done(sim, engine, now)
            engine.relieve_kv_pressure(now)
            self._kick(engine, now, arrival=False)
            if self._draining:
                self._maybe_retire(engine, now)
        elif kind in (_TOOL, _MIGRATED) and now < self._busy_until:
            self._push(self._busy_until, kind, key)  # handled once the planner returns
        elif kind == _TOOL:
            self._tool_done(self.sims[key], now)
        elif kind == _MIGRATED:
            self._migrated(self.sims[key], now)
        elif kind == _ARRIVE:
            self._arrive(self.sims[key], now)
        elif kind == _READY:
            self._dispatch(self.sims[key], now)
        elif kind == _PLANNED:
            self._planned(now)
        elif kind == _MERGED:
            self._merged(now)
        elif kind == _REPLAN:
            self._consider_merge(now)
            spent = self._replan(now)
            if self._finished < len(self.sims):
                # The session's loop waits the interval after a plan returns.
                self._push(now + spent + self.config.replan_interval_s, _REPLAN, "")
        else:
            raise HeddleError(f"unknown simulator event {kind}; this is a bug in the simulator")

    def finish_times(self) -> list[float]:
        return [s.finish_s if s.finish_s is not None else math.nan for s in self.sims.values()]


# -- the start-up decisions' simulations (sim/_minis.py) --------------------------
@dataclass(frozen=True)
class MiniRun:
    """One simulation of a decision: ``scripts`` on ``shape`` under ``policy``, with
    ``config`` (never charged for planning itself); ``keep_groups``: whole GRPO groups
    on one engine (the co-location candidate). Picklable: it crosses to a worker."""

    scripts: Sequence[TrajectoryScript]
    cluster: ClusterSpec
    policy: SchedulingPolicy
    tool_means_s: Mapping[str, float]
    history: Sequence[FinishedTrajectory]
    shape: PoolShape | None
    perf: PerfModel
    config: SimConfig
    keep_groups: bool = False


def run_mini(run: MiniRun) -> tuple[float, int]:
    """``run``'s makespan and the events it handled (top level: a worker calls it)."""
    sim = Simulator(
        run.scripts,
        run.cluster,
        run.policy,
        tool_means_s=run.tool_means_s,
        history=run.history,
        shape=run.shape,
        perf=run.perf,
        config=run.config,
    )
    if run.keep_groups:
        sim.placement = GroupStickyPlacement()
    result = sim.run()
    return result.makespan_s, result.events


class MiniRunner(Protocol):
    """Runs a wave; its results in the order of ``runs``, the same on any runner."""

    def run_wave(self, runs: Sequence[MiniRun]) -> tuple[list[float], Wave]: ...


class InlineRunner:
    """Each run in this process, one after another; the wave is recorded as running on
    ``workers`` processes (what the live session would use), which is what the
    simulator charges."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers

    def run_wave(self, runs: Sequence[MiniRun]) -> tuple[list[float], Wave]:
        results = [run_mini(r) for r in runs]
        sizes = [len(r.scripts) for r in runs]
        wave = Wave(tuple(e for _, e in results), wave_workers(sizes, self.workers))
        return [m for m, _ in results], wave


def judge_colocation(
    trajectories: Sequence[Trajectory],
    records: Sequence[FinishedTrajectory],
    *,
    cluster: ClusterSpec,
    policy: str,
    shape: PoolShape,
    perf: PerfModel,
    config: SimConfig,
    tool_means_s: Mapping[str, float],
    predictor: str | None = None,
    runner: MiniRunner | None = None,
) -> tuple[GroupStickyPlacement | None, ColocationDecision]:
    """Heddle's co-location decision (:func:`decide_colocation`) for a run: the simulator's
    Heddle runs and the live session (rollout/_colocation.py) both ask it here.

    ``trajectories`` carry the predictor's remaining lengths; ``records`` the workload
    sketch (the previous rollout, or the predictor's prior: never the run's true
    lengths); ``policy`` the routing in effect (the planner's fallback, if it took one)
    and ``config`` the run's (its in-flight cap and ``speculation``); ``predictor`` the
    run's length predictor (a routing without one still predicts with it: the seeding
    gate reads it); ``runner`` runs its simulations (default: inline). A group-keeping
    placement (None: groups are not kept whole) and the verdict: why, whether the run
    still seeds texts (``seed``; False where the co-located sketch ran no slower
    without), and the waves its simulations ran in. A pool larger than the shape
    planner's replica is judged on a replica first; a "no" there is asked again of the
    whole pool, whose answer decides (the replica understates co-location's lead).
    """
    spec = config.speculation
    if spec is None or not spec.config.enabled:
        return None, ColocationDecision(False, "off (no speculation)")
    means = [v for v in tool_means_s.values() if math.isfinite(v)]
    mean_s = sum(means) / len(means) if means else 0.0
    sketch = workload_sketch(records, tool_latency_s=mean_s)
    routing = get_policy(policy)
    if predictor is not None and routing.predictor is None:
        # The run routes as ``policy`` and predicts with its own predictor, which the
        # seeding gate reads: without it the sketch's runs would never seed a text.
        routing = replace(routing, predictor=predictor)
    waves: list[Wave] = []

    def judged(scale: int) -> tuple[GroupStickyPlacement | None, ColocationDecision]:
        # On 1/scale of the GPUs running every scale-th group, each whole (1: the pool).
        scripts, sim_cluster, sim_shape = sketch, cluster, shrink_shape(shape, scale)
        if scale > 1:
            scripts = group_replica(sketch, scale)
            sim_cluster = replace(cluster, gpus=cluster.gpus // scale)

        def simulate(asked: Sequence[tuple[bool, bool]]) -> list[float]:
            # The sketch under the routing in effect, with this run's speculation (its
            # seeding, or none), groups kept whole or not: one wave. Never the run's
            # own scripts (their lengths are not known to the session).
            # A replica holds the pool's share of a task's earlier samples, not a
            # 1/scale pool's: the previous iteration spread them over all its engines.
            def mini(colocate: bool, seed: bool) -> MiniRun:
                run_spec = replace(
                    spec if seed else spec.unseeded(),
                    colocate_groups=False,
                    pool_engines=spec.pool_engines or shape.num_instances,
                )
                run_config = replace(config, planner_cost=None, speculation=run_spec)
                # history=records: what the run's predictor knows, the sketch's source.
                return MiniRun(
                    scripts, sim_cluster, routing, {"tool": mean_s}, records, sim_shape,
                    perf, run_config, keep_groups=colocate,
                )  # fmt: skip

            makespans, wave = (runner or InlineRunner()).run_wave([mini(*a) for a in asked])
            waves.append(wave)
            return makespans

        return colocation_placement(
            trajectories,
            shape.num_instances,
            shape.tps()[0],
            spec,
            perf,
            replica=scale,
            simulate=simulate if sim_shape is not None else None,
        )

    # A pool larger than the shape planner's replica is judged on one of its replicas
    # first. A replica's "yes" stands; its "no" is asked again of the whole pool: at
    # 8,192 on 64 the replica saw 3-4% where the pool's sketch saw 7-9% and the runs
    # gained 4-8% (docs/speculation.md, "Group co-location").
    scale = replica_scale(cluster.gpus, cluster.gpus_per_node, len(records))
    placement, verdict = judged(scale)
    if scale > 1 and not verdict.colocate and verdict.predicted_colocated_s > 0:
        first = verdict
        placement, verdict = judged(1)
        verdict = replace(
            verdict,
            reason=f"{verdict.reason}; a 1/{scale} replica had said "
            f"{first.predicted_colocated_s:.0f}s co-located vs {first.predicted_scattered_s:.0f}s",
        )
    return placement, replace(verdict, waves=tuple(waves))


class SimulatedShapePlanner(ReplicaShapePlanner):
    """The shape planner whose mini-simulations run this simulator (see :mod:`._plan`).

    ``speculation``: the run's (None: plain decode). Every candidate is scored with it,
    as the run will speculate whichever it picks: a cap that wins on plain decode can
    lose with drafts (groups are kept whole only by the co-location decision, later).
    ``runner`` runs each wave of candidates (default: inline); ``waves`` records them.
    """

    def __init__(
        self,
        perf: PerfModel,
        config: ShapeConfig,
        *,
        speculation: SimSpeculation | None = None,
        runner: MiniRunner | None = None,
        **options: Any,
    ) -> None:
        super().__init__(perf, config, **options)
        self.waves: list[Wave] = []  # as they ran (their time: PlannerCost.decisions_s)
        self.runner: MiniRunner = runner or InlineRunner()
        self.speculation = (
            None if speculation is None else replace(speculation, colocate_groups=False)
        )

    def _makespan(self, run: ReplicaRun) -> float:
        return self._makespans([run])[0]

    def _makespans(self, runs: Sequence[ReplicaRun]) -> list[float]:
        makespans, wave = self.runner.run_wave([self._mini(run) for run in runs])
        self.waves.append(wave)
        return makespans

    @property
    def simulated_events(self) -> int:
        """Events its mini-simulations handled (their CPU)."""
        return sum(sum(w.events) for w in self.waves)

    def _mini(self, run: ReplicaRun) -> MiniRun:
        speculation = self.speculation
        if speculation is not None and run.pool_engines:
            # Credited the history the pool's engines hold, as the co-location verdict's
            # replica is (judge_colocation), not the replica's larger share.
            speculation = replace(speculation, pool_engines=run.pool_engines)
        config = SimConfig(
            max_trajectories_per_engine=run.cap, planner_cost=None, speculation=speculation
        )
        return MiniRun(
            run.scripts, run.cluster, get_policy(run.policy), run.tool_means_s, run.history,
            run.shape, self.perf, config,
        )  # fmt: skip
