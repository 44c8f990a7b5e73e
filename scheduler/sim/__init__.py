"""heddle.scheduler.sim: a discrete-event simulator of a GPU rollout cluster.

Entities (:class:`SimTrajectory`, :class:`SimEngine`), events (engine
wake-ups, tool replies, migrations, re-plans) and the explicit performance
model (:class:`heddle.scheduler.PerfModel`) as the execution-time predictor.
Engines jump from batch change to batch change, so a 64-GPU rollout of
thousands of trajectories simulates in seconds. See docs/simulator.md.
"""

from ._bound import LowerBound, lower_bound
from ._entities import SimEngine, SimTrajectory
from ._iterations import (
    ITERATION_POLICIES,
    IterationPolicy,
    IterationResult,
    IterationSimulator,
    TrainerModel,
    iteration_policy,
    stream_of,
)
from ._minis import (
    DECISION_WORKERS,
    MIN_PARALLEL_TRAJECTORIES,
    Wave,
    wave_events,
    wave_workers,
)
from ._plan import planner_cluster, workload_sketch
from ._results import SimResult
from ._simulator import (
    InlineRunner,
    MiniRun,
    MiniRunner,
    PlannerCost,
    SimConfig,
    SimulatedShapePlanner,
    Simulator,
    judge_colocation,
    run_mini,
)
from ._speculation import (
    EngineSpeculator,
    GroupStickyPlacement,
    SimSpeculation,
    heddle_speculation,
)

__all__ = [
    "DECISION_WORKERS",
    "ITERATION_POLICIES",
    "MIN_PARALLEL_TRAJECTORIES",
    "EngineSpeculator",
    "GroupStickyPlacement",
    "InlineRunner",
    "IterationPolicy",
    "IterationResult",
    "IterationSimulator",
    "LowerBound",
    "MiniRun",
    "MiniRunner",
    "PlannerCost",
    "SimConfig",
    "SimEngine",
    "SimResult",
    "SimSpeculation",
    "SimTrajectory",
    "SimulatedShapePlanner",
    "Simulator",
    "TrainerModel",
    "Wave",
    "heddle_speculation",
    "iteration_policy",
    "judge_colocation",
    "lower_bound",
    "planner_cluster",
    "run_mini",
    "stream_of",
    "wave_events",
    "wave_workers",
    "workload_sketch",
]
