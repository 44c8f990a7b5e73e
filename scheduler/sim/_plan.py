"""The simulating shape planner: score candidate TP mixes by mini-simulations.

The annealing planner (:mod:`.._shape`) scores a shape by the predicted
makespan of a contiguous placement with a fixed typical context: it sees
neither the KV cache at each TP degree, nor the recompute that follows when
the resident contexts overflow it, nor the batch cap, nor tool time. On the
benchmark workloads that made it pick TP2-heavy shapes that recompute
hundreds of millions of tokens (docs/benchmarks.md).

:class:`SimulatedShapePlanner` scores each candidate shape by running the
simulator itself, on a scaled-down replica of the pool: ``1/s`` of the GPUs
and every ``s``-th trajectory of a *workload sketch* (the previous rollout,
or the predictor's prior), sorted by length so the longest trajectory is in
the sample and the length distribution is kept. Per engine, the replica has
the same trajectories in flight, the same context lengths, the same KV cache,
batch cap and tool gaps as the full pool, so the engine-level effects the
annealing planner misses are simulated, not estimated. Candidates: every
homogeneous shape whose KV cache holds the longest context, and the
annealing planner's mixed shape for the sample. Each is run under a cheap
proxy policy (``verl``: FCFS, sticky) at each in-flight cap of ``caps`` and
scored by its best makespan (how well the shape can be run); the winner is
replicated ``s`` times. A mixed shape's proxy score is pessimistic (verl's
routing does not send the tail to the high-TP engines; Heddle's placement
does), so a mixed shape wins only where it wins even so.

The planner here does not import the simulator (which plans its initial shape
with it): :class:`ReplicaShapePlanner` leaves the run of one replica to a
subclass, and ``_simulator.SimulatedShapePlanner`` runs it on the simulator.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from heddle.exceptions import ConfigError, InfeasibleError

from .._cluster import ClusterSpec
from .._evaluation import history_of
from .._perf import PerfModel
from .._policies import get_policy
from .._shape import AnnealingShapePlanner, ShapeConfig, ShapePlan
from .._types import FinishedTrajectory, PoolShape, check_tp_sizes, fits_nodes, node_sizes
from .._workload import TrajectoryScript

__all__ = [
    "PLAN_DRAWS",
    "ReplicaRun",
    "ReplicaShapePlanner",
    "planner_cluster",
    "replica_scale",
    "resample_groups",
    "workload_sketch",
]

_TOOL = "tool"


def workload_sketch(
    records: Sequence[FinishedTrajectory],
    *,
    tool_latency_s: float,
    tool_output_tokens: float = 128.0,
) -> list[TrajectoryScript]:
    """Trajectory scripts the planner can simulate, from finished (or predicted) records.

    Turn lengths are the record's when known, else its total split evenly over
    its turns; a tool call follows every turn but the last, taking the
    record's observed tool latencies when known (their spread matters: the
    migration planner times moves by the mean), else ``tool_latency_s`` (the
    tools' mean), and returning the record's tool reply lengths when known,
    else ``tool_output_tokens``.
    """
    if tool_latency_s < 0 or not math.isfinite(tool_latency_s):
        raise ConfigError(f"tool_latency_s={tool_latency_s} must be a finite number >= 0")
    scripts: list[TrajectoryScript] = []
    for i, r in enumerate(records):
        total = max(1, int(r.total_tokens))
        turns = max(1, min(int(r.turns), total))
        if len(r.turn_tokens) == turns and sum(r.turn_tokens) == total and min(r.turn_tokens) > 0:
            turn_tokens = tuple(int(x) for x in r.turn_tokens)
        else:
            base, extra = divmod(total, turns)
            turn_tokens = tuple(base + (1 if k < extra else 0) for k in range(turns))
        if len(r.tool_output_tokens) == turns - 1:
            outputs = tuple(int(x) for x in r.tool_output_tokens)
        else:
            outputs = (max(0, round(tool_output_tokens)),) * (turns - 1)
        if len(r.tool_latency_s) == turns - 1:
            latencies = tuple(float(x) for x in r.tool_latency_s)
        else:
            latencies = (float(tool_latency_s),) * (turns - 1)
        scripts.append(
            TrajectoryScript(
                id=f"plan{i}",
                group_id=r.group_id,
                sample=i,
                prompt_tokens=max(0, int(r.prompt_tokens)),
                turn_tokens=turn_tokens,
                tool_names=(_TOOL,) * (turns - 1),
                tool_latency_s=latencies,
                tool_output_tokens=outputs,
            )
        )
    return scripts


def planner_cluster(
    perf: PerfModel, gpus: int, gpus_per_node: int, tensor_parallel_sizes: Sequence[int]
) -> ClusterSpec:
    """The cluster a planner's simulations run on: ``gpus`` GPUs whose engines ``perf``
    models (the shape planner's replicas, the live session's co-location decision)."""
    smallest = min(tensor_parallel_sizes)
    return ClusterSpec(
        name="shape-plan",
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        model="qwen3-8b",  # placeholders: the simulations run on ``perf``
        hardware="h100-sxm",
        tensor_parallel_sizes=tuple(tensor_parallel_sizes),
        baseline_tp=smallest if gpus % smallest == 0 else 1,
        batch_cap=perf.batch_cap,
    )


def replica_scale(
    gpus: int, gpus_per_node: int, trajectories: int, mini_gpus: int = 16, min_sample: int = 512
) -> int:
    """How many copies of the planner's replica make the pool (1: the whole pool)."""
    scale = 1
    for s in range(2, gpus + 1):
        if gpus % s or (gpus // s) % gpus_per_node or gpus // s < mini_gpus:
            continue
        if trajectories // s < min_sample:
            continue
        scale = s
    return scale


@dataclass(frozen=True)
class ReplicaRun:
    """One mini-simulation: ``scripts`` on ``shape`` under ``policy`` at in-flight ``cap``;
    ``pool_engines``: the engines of the pool the replica stands for (a task's earlier
    samples were spread over those, not over the replica's)."""

    scripts: Sequence[TrajectoryScript]
    cluster: ClusterSpec
    policy: str
    tool_means_s: Mapping[str, float]
    history: Sequence[FinishedTrajectory]
    shape: PoolShape
    cap: int | None
    pool_engines: int | None = None


# How much sooner a replica must say a plan finishes before it is trusted (the
# replica's measured error; ReplicaShapePlanner's docstring).
REPLICA_MARGIN = 0.10
# Resamples of the sketch's groups on which a kept policy must win too (the docstring).
PLAN_DRAWS = 2


@dataclass(frozen=True)
class _Replica:
    scale: int  # the full pool is ``scale`` copies of the replica
    gpus: int
    scripts: list[TrajectoryScript]


class ReplicaShapePlanner(ABC):
    """Picks the TP mix whose scaled-down simulation finishes the workload sketch soonest.

    A subclass runs one replica (:meth:`_makespan`); the simulator's is
    ``SimulatedShapePlanner``, the one to use.

    ``mini_gpus``: the replica's GPUs (at least; the whole pool when smaller);
    ``min_sample``: the fewest trajectories a replica keeps (a small workload
    is simulated whole); ``caps``: in-flight caps per engine each candidate is
    tried with; ``proxy``: the policy the mini-simulations run; ``fallbacks``:
    the step-centric policies the pool may run instead of ``policy`` (each at
    every cap, on the chosen shape); ``margin``: how much sooner ``policy``
    must finish than the best of them in the replica to be kept. The replica
    keeps per-engine effects but not the cross-engine ones of a larger pool
    (placement over more engines, migrations): on ``search`` at 8,192
    trajectories, the replica (4 engines) put Heddle 7% ahead of verl and the
    64-GPU pool (16 engines) 5% behind it, while progressive priority alone
    (``heddle-order``) was 1.7% ahead (docs/benchmarks.md). So a replica smaller
    than the pool judges only ``per_engine_variants`` (``heddle`` ->
    ``heddle-order``), and a win inside the margin is not trusted.

    The margin is 10% because that is what the replica's errors measured call
    for: at 2,048 trajectories on 16 GPUs, where the replica is the whole pool,
    it predicted Heddle 8.6%, 9.9%, 5.9% and 6.2% ahead of the best static
    configuration on search, pareto, math and bimodal, and the rollouts came
    out at +1.6%, +2.2%, -3.5% and -9.4% (docs/benchmarks.md): a lead of 7 to
    16 points less than predicted. Under 10% Heddle's own scheduling is not a
    bet worth a rollout; the best static configuration is.

    The sketch is one draw of the workload, and an ordering's lead can be where
    that draw's long groups fell: on ``bimodal`` at 2,048 with speculation, the
    sketch put ``heddle-order`` 10.6% ahead of verl at cap 128, and the run's
    own draw 21% behind. So a kept policy must also win by ``margin`` on
    ``draws`` bootstrap resamples of the replica's GRPO groups
    (:func:`resample_groups`; there it was 6.0% ahead and 10.2% behind); a
    loss on any sends the pool to the best static configuration.
    """

    name = "simulated"

    def __init__(
        self,
        perf: PerfModel,
        config: ShapeConfig,
        *,
        mini_gpus: int = 16,
        min_sample: int = 512,
        caps: Sequence[int | None] = (None, 64, 128),
        proxy: str = "verl",
        fallbacks: Sequence[str] = ("verl", "slime"),
        margin: float = REPLICA_MARGIN,
        per_engine_variants: Mapping[str, str] | None = None,
        draws: int = PLAN_DRAWS,
    ) -> None:
        if mini_gpus < 1:
            raise ConfigError(f"mini_gpus={mini_gpus} must be >= 1")
        if not caps:
            raise ConfigError("caps: give at least one in-flight cap (None for uncapped)")
        self.perf = perf
        self.config = config
        self.allowed = check_tp_sizes(config.tensor_parallel_sizes, config.gpus_per_node)
        self.mini_gpus = mini_gpus
        self.min_sample = min_sample
        self.caps = tuple(caps)
        self.proxy = get_policy(proxy)
        self.fallbacks = tuple(get_policy(f).name for f in fallbacks)
        if any(get_policy(f).adaptive_shape for f in self.fallbacks):
            raise ConfigError(f"fallbacks={list(fallbacks)}: give fixed-shape policies")
        if not 0.0 <= margin < 1.0:
            raise ConfigError(f"margin={margin} must be in [0, 1)")
        self.margin = margin
        if draws < 0:
            raise ConfigError(f"draws={draws} must be >= 0 (0: the sketch alone decides)")
        self.draws = draws
        self.per_engine_variants = dict(
            {"heddle": "heddle-order", "heddle-dynamic": "heddle-order"}
            if per_engine_variants is None
            else per_engine_variants
        )
        if self.proxy.adaptive_shape:
            raise ConfigError(f"proxy={proxy!r} plans its own shape; give a fixed-shape policy")
        self.scores: dict[str, float] = {}  # the last plan's candidates (replica shape -> s)

    # -- the replica ----------------------------------------------------------
    def _replica(self, sketch: Sequence[TrajectoryScript]) -> _Replica:
        gpus, per_node = self.config.gpu_budget, self.config.gpus_per_node
        scale = replica_scale(gpus, per_node, len(sketch), self.mini_gpus, self.min_sample)
        order = sorted(range(len(sketch)), key=lambda i: (-sketch[i].total_tokens, i))
        kept = sorted(order[::scale])  # every s-th by length, the longest included; task order
        return _Replica(scale, gpus // scale, [sketch[i] for i in kept])

    def _cluster(self, gpus: int) -> ClusterSpec:
        return planner_cluster(self.perf, gpus, self.config.gpus_per_node, self.allowed)

    def _candidates(self, replica: _Replica, longest: int) -> list[PoolShape]:
        usable = [tp for tp in self.allowed if self.perf.kv_capacity_tokens(tp) >= longest]
        if not usable:
            raise InfeasibleError(
                f"{self.perf.model.name}: no allowed TP size {list(self.allowed)} holds this "
                f"workload's longest context ({longest} tokens); allow larger TP sizes"
            )
        nodes = node_sizes(replica.gpus, self.config.gpus_per_node)
        shapes: list[PoolShape] = []
        for tp in usable:
            tps = [tp] * (replica.gpus // tp)
            if tps and fits_nodes(tps, nodes):
                shapes.append(PoolShape.of(tps))
        mixed_config = ShapeConfig(
            gpu_budget=replica.gpus,
            gpus_per_node=self.config.gpus_per_node,
            tensor_parallel_sizes=tuple(usable),
            reshape_s=0.0,
            iterations=self.config.iterations,
            seed=self.config.seed,
        )
        try:
            lengths = [float(s.total_tokens) for s in replica.scripts]
            mixed = AnnealingShapePlanner(self.perf, mixed_config).plan(lengths, None).shape
        except InfeasibleError:
            mixed = None
        if mixed is not None and mixed.gpus and mixed not in shapes:
            shapes.append(mixed)
        return shapes

    @abstractmethod
    def _makespan(self, run: ReplicaRun) -> float:
        """The makespan of ``run``; its planner calls are not to be charged (the replica
        scores shapes against each other at a fraction of the pool's size, where they
        would cost a fraction)."""

    def _makespans(self, runs: Sequence[ReplicaRun]) -> list[float]:
        """The makespans of one wave of independent runs, in order (a subclass may run
        them side by side: the simulator's runs them on a :class:`MiniRunner`)."""
        return [self._makespan(run) for run in runs]

    def _simulate_all(
        self,
        replica: _Replica,
        runs: Sequence[tuple[PoolShape, str, int | None, Sequence[FinishedTrajectory]]],
    ) -> list[float]:
        """``(shape, policy, cap, history)`` runs of ``replica``, as one wave."""
        tool_means_s = {_TOOL: _mean_latency(replica.scripts)}
        cluster = self._cluster(replica.gpus)
        return self._makespans(
            [
                ReplicaRun(
                    replica.scripts, cluster, policy, tool_means_s, history, shape, cap,
                    shape.num_instances * replica.scale,
                )
                for shape, policy, cap, history in runs
            ]
        )  # fmt: skip

    def _wins_on_draw(
        self,
        replica: _Replica,
        shape: PoolShape,
        draw: int,
        policy: str,
        static: tuple[str, int | None],
        history: Sequence[FinishedTrajectory],
    ) -> bool:
        """Whether ``policy`` beats the static configuration by ``margin`` on resample
        ``draw`` of the replica's groups (both makespans go to ``scores``)."""
        other = _Replica(replica.scale, replica.gpus, resample_groups(replica.scripts, draw))
        own, fixed = self._simulate_all(
            other, [(shape, policy, None, history), (shape, static[0], static[1], ())]
        )
        self.scores[f"{policy} {shape} draw {draw}"] = own
        self.scores[f"static {static[0]} cap{static[1]} {shape} draw {draw}"] = fixed
        return own <= fixed * (1.0 - self.margin)

    # -- the plan -----------------------------------------------------------------
    def plan_workload(
        self,
        sketch: Sequence[TrajectoryScript],
        current: PoolShape | None,
        *,
        policy: str | None = None,
    ) -> ShapePlan:
        """The shape to run ``sketch`` on (``current`` when no change beats ``reshape_s``).

        With ``policy`` (a trajectory-scheduling policy such as ``heddle``), the
        replica also runs it on the chosen shape, uncapped as it runs, its
        predictor seeded with the sketch's trajectories outside the replica; unless
        it finishes sooner than the best fallback policy and cap on that shape by
        ``margin``, the plan says to run that configuration instead
        (``fallback_policy``, ``max_trajectories_per_engine``): where trajectory
        scheduling is not predicted to help, the pool runs as the best-tuned
        step-centric configuration would.
        """
        if not sketch:
            shape = current or PoolShape.of({min(self.allowed): self.config.gpu_budget})
            return ShapePlan(shape, 0.0, 0.0 if current else None, False, 0)
        longest = max(s.prompt_tokens + s.total_tokens + sum(s.tool_output_tokens) for s in sketch)
        replica = self._replica(sketch)
        shapes = self._candidates(replica, longest)
        current_small = shrink_shape(current, replica.scale) if current is not None else None
        if (
            current_small is not None
            and current_small not in shapes
            and all(self.perf.kv_capacity_tokens(tp) >= longest for tp in current_small.tps())
        ):
            shapes.append(current_small)
        self.scores = {}
        caps: dict[str, int | None] = {}
        # Wave 1: the proxy on every candidate shape at every cap.
        found = iter(
            self._simulate_all(
                replica, [(sh, self.proxy.name, cap, ()) for sh in shapes for cap in self.caps]
            )
        )
        for shape in shapes:
            results = [(next(found), cap) for cap in self.caps]
            self.scores[str(shape)], caps[str(shape)] = min(
                results, key=lambda r: (r[0], r[1] is not None)
            )
        best = min(shapes, key=lambda sh: (self.scores[str(sh)], -max(sh.tps())))
        best_cost = self.scores[str(best)]
        fallback: str | None = None
        cap: int | None = None
        if policy is not None and policy != self.proxy.name:
            # Wave 2, on the chosen shape: the step-centric configurations it must beat
            # (the proxy at its best cap, and each other fallback policy at every cap) and
            # the policy's own variants.
            fixed = [(n, c) for n in self.fallbacks if n != self.proxy.name for c in self.caps]
            used = {s.id for s in replica.scripts}
            others = [s for s in sketch if s.id not in used] or list(sketch)
            # The others (or, for a replica of the whole pool, the sketch) seed the
            # predictor's hyperparameters as an earlier rollout does; renamed so no
            # replica trajectory sees a sibling's length.
            seed = [replace(r, group_id=f"seed-{r.group_id}") for r in history_of(others)]
            # A replica with fewer engines than the pool cannot vouch for cross-engine
            # mechanisms (placement, migration): then only the policy's per-engine
            # variant (its ordering alone) is a candidate.
            variants = [policy] if replica.scale == 1 else []
            if policy in self.per_engine_variants:
                variants.append(self.per_engine_variants[policy])
            runs = [(best, n, c, ()) for n, c in fixed] + [(best, v, None, seed) for v in variants]
            found = iter(self._simulate_all(replica, runs))
            options = [(best_cost, self.proxy.name, caps[str(best)])]
            options += [(next(found), n, c) for n, c in fixed]
            static_cost, static_policy, static_cap = min(
                options, key=lambda o: (o[0], o[1] != self.proxy.name, o[2] is not None)
            )
            own_cost, own_policy = math.inf, policy
            for variant in variants:
                cost = next(found)
                self.scores[f"{variant} {best}"] = cost
                if cost < own_cost:
                    own_cost, own_policy = cost, variant
            self.scores[f"static {static_policy} cap{static_cap} {best}"] = static_cost
            kept = own_cost <= static_cost * (1.0 - self.margin)
            for draw in range(1, self.draws + 1):
                if not kept:
                    break
                static = (static_policy, static_cap)
                kept = self._wins_on_draw(replica, best, draw, own_policy, static, seed)
            if not kept:
                fallback, cap, best_cost = static_policy, static_cap, static_cost
            else:
                fallback = None if own_policy == policy else own_policy
                best_cost = own_cost
        proposed = _grow(best, replica.scale)
        n = len(shapes)
        if current is None:
            return ShapePlan(proposed, best_cost, None, False, n, fallback, cap)
        current_cost = self.scores.get(str(current_small), math.inf) if current_small else math.inf
        if proposed != current and best_cost + self.config.reshape_s < current_cost:
            return ShapePlan(proposed, best_cost, current_cost, True, n, fallback, cap)
        return ShapePlan(current, current_cost, current_cost, False, n, fallback, cap)

    def plan_history(
        self,
        history: Sequence[FinishedTrajectory],
        current: PoolShape | None,
        *,
        tool_means_s: Mapping[str, float],
        tool_output_tokens: float = 128.0,
        policy: str | None = None,
    ) -> ShapePlan:
        """:meth:`plan_workload` on the sketch of ``history`` (records or predictions)."""
        means = [v for v in tool_means_s.values() if math.isfinite(v)]
        latency = float(np.mean(means)) if means else 0.0
        sketch = workload_sketch(
            history, tool_latency_s=latency, tool_output_tokens=tool_output_tokens
        )
        return self.plan_workload(sketch, current, policy=policy)


def group_replica(scripts: Sequence[TrajectoryScript], scale: int) -> list[TrajectoryScript]:
    """Every ``scale``-th GRPO group of ``scripts`` by total length (the longest kept),
    whole, in their order: the replica a placement that keeps groups whole is judged on
    (the shape planner's replica samples trajectories, which splits groups)."""
    if scale <= 1:
        return list(scripts)
    totals: dict[str, int] = {}
    for s in scripts:
        totals[s.group_id] = totals.get(s.group_id, 0) + s.total_tokens
    ranked = sorted(totals, key=lambda g: -totals[g])  # stable: first seen first on ties
    kept = set(ranked[::scale])
    return [s for s in scripts if s.group_id in kept]


def resample_groups(scripts: Sequence[TrajectoryScript], draw: int) -> list[TrajectoryScript]:
    """A bootstrap resample of ``scripts``' GRPO groups: as many groups, drawn with
    replacement (numpy seed ``draw``), each copy renamed so no two share an id or a
    group; the same draw gives the same resample."""
    groups: dict[str, list[TrajectoryScript]] = {}
    for s in scripts:
        groups.setdefault(s.group_id, []).append(s)
    ids = list(groups)
    picks = np.random.default_rng(draw).integers(0, len(ids), size=len(ids))
    return [
        replace(s, id=f"d{draw}-{n}-{s.id}", group_id=f"d{draw}-{n}-{s.group_id}")
        for n, i in enumerate(picks)
        for s in groups[ids[int(i)]]
    ]


def _mean_latency(scripts: Sequence[TrajectoryScript]) -> float:
    values = [x for s in scripts for x in s.tool_latency_s]
    return float(np.mean(values)) if values else 0.0


def shrink_shape(shape: PoolShape, scale: int) -> PoolShape | None:
    """``shape`` as ``scale`` identical replicas' one replica, or None if it is not one."""
    if any(n % scale for _, n in shape.counts):
        return None
    return PoolShape.of({tp: n // scale for tp, n in shape.counts})


def _grow(shape: PoolShape, scale: int) -> PoolShape:
    return PoolShape.of({tp: n * scale for tp, n in shape.counts})
