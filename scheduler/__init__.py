"""heddle.scheduler: trajectory-level scheduling, pure Python + numpy.

Everything the operator, the worker and the simulator decide about *when*,
*where* and *how* a trajectory runs is computed here, with no I/O:

* :class:`SiblingPredictor` – remaining-length prediction from progress and GRPO siblings,
* :class:`ProgressivePriority` – longest predicted remaining first, with preemption,
* :func:`plan_placement` / :class:`DPPlacement` – presorted-DP placement over instances,
* :class:`ToolWindowMigration` – moves during tool calls, one per sender and receiver,
* :class:`AnnealingShapePlanner` – the TP mix of a pool under its GPU budget,
* the baselines (``verl``, ``verl-star``, ``slime``, ``fcfs``) behind the same interfaces,
* :class:`PerfModel` – the explicit engine performance model all of them share.

This package imports only the standard library, numpy and :mod:`heddle.exceptions`
(checked by tests/quality).
"""

from ._cluster import ClusterSpec
from ._dp import Items, aggregate, group_cost, solve_contiguous
from ._evaluation import PredictorQuality, evaluate_predictor, history_of
from ._limits import SAMPLING_LIMITS, SamplingLimits
from ._migration import MigrationConfig, MigrationPlanner, Move, NoMigration, ToolWindowMigration
from ._ordering import (
    FCFSOrdering,
    OrderingPolicy,
    ProgressivePriority,
    engine_priority,
    pick_preemption,
)
from ._perf import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    EngineInstance,
    HardwareSpec,
    ModelSpec,
    PerfModel,
)
from ._placement import (
    ClusterView,
    DPPlacement,
    LeastLoadPlacement,
    PlacementPlan,
    PlacementPolicy,
    RoundRobinPlacement,
    StickyPlacement,
    ThresholdStickyPlacement,
    plan_placement,
    solve_lengths,
)
from ._policies import (
    BASELINES,
    POLICIES,
    SIMULATION_ONLY,
    SchedulingPolicy,
    get_policy,
    make_migration,
    make_ordering,
    make_placement,
    make_predictor,
)
from ._predictor import (
    LengthPredictor,
    OraclePredictor,
    Prediction,
    PredictorConfig,
    ProgressPredictor,
    SiblingPredictor,
)
from ._profiled import (
    PROFILE_FORMAT,
    DecodeFit,
    EngineProfile,
    PrefillFit,
    ProfiledPerfModel,
    StepOverhead,
    fit_decode,
    fit_prefill,
    load_profile,
)
from ._reshape import EngineSnapshot, Merge, TailMergeConfig, TailMergePlanner
from ._shape import AnnealingShapePlanner, FixedShape, ShapeConfig, ShapePlan, ShapePlanner
from ._stats import pearson, tail_recall
from ._trace import (
    TRACE_FORMAT,
    TRACE_VERSION,
    BenchWorkload,
    scripts_from_trace,
    synthetic_bench,
    trace_bench,
)
from ._types import (
    FinishedTrajectory,
    PoolShape,
    Trajectory,
    TrajectoryState,
    check_tp_sizes,
    fits_nodes,
    node_sizes,
)
from ._workload import Distribution, ToolSpec, TrajectoryScript, WorkloadSpec, generate

__all__ = [
    "BASELINES",
    "HARDWARE_PRESETS",
    "MODEL_PRESETS",
    "POLICIES",
    "PROFILE_FORMAT",
    "SAMPLING_LIMITS",
    "SIMULATION_ONLY",
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "AnnealingShapePlanner",
    "BenchWorkload",
    "ClusterSpec",
    "ClusterView",
    "DPPlacement",
    "DecodeFit",
    "Distribution",
    "EngineInstance",
    "EngineProfile",
    "EngineSnapshot",
    "FCFSOrdering",
    "FinishedTrajectory",
    "FixedShape",
    "HardwareSpec",
    "Items",
    "LeastLoadPlacement",
    "LengthPredictor",
    "Merge",
    "MigrationConfig",
    "MigrationPlanner",
    "ModelSpec",
    "Move",
    "NoMigration",
    "OraclePredictor",
    "OrderingPolicy",
    "PerfModel",
    "PlacementPlan",
    "PlacementPolicy",
    "PoolShape",
    "Prediction",
    "PredictorConfig",
    "PredictorQuality",
    "PrefillFit",
    "ProfiledPerfModel",
    "ProgressPredictor",
    "ProgressivePriority",
    "RoundRobinPlacement",
    "SamplingLimits",
    "SchedulingPolicy",
    "ShapeConfig",
    "ShapePlan",
    "ShapePlanner",
    "SiblingPredictor",
    "StepOverhead",
    "StickyPlacement",
    "TailMergeConfig",
    "TailMergePlanner",
    "ThresholdStickyPlacement",
    "ToolSpec",
    "ToolWindowMigration",
    "Trajectory",
    "TrajectoryScript",
    "TrajectoryState",
    "WorkloadSpec",
    "aggregate",
    "check_tp_sizes",
    "engine_priority",
    "evaluate_predictor",
    "fit_decode",
    "fit_prefill",
    "fits_nodes",
    "generate",
    "get_policy",
    "group_cost",
    "history_of",
    "load_profile",
    "make_migration",
    "make_ordering",
    "make_placement",
    "make_predictor",
    "node_sizes",
    "pearson",
    "pick_preemption",
    "plan_placement",
    "scripts_from_trace",
    "solve_contiguous",
    "solve_lengths",
    "synthetic_bench",
    "tail_recall",
    "trace_bench",
]
