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
from ._plan import planner_cluster, workload_sketch
from ._results import SimResult
from ._simulator import (
    PlannerCost,
    SimConfig,
    SimulatedShapePlanner,
    Simulator,
    judge_colocation,
)
from ._speculation import (
    EngineSpeculator,
    GroupStickyPlacement,
    SimSpeculation,
    heddle_speculation,
)

__all__ = [
    "ITERATION_POLICIES",
    "EngineSpeculator",
    "GroupStickyPlacement",
    "IterationPolicy",
    "IterationResult",
    "IterationSimulator",
    "LowerBound",
    "PlannerCost",
    "SimConfig",
    "SimEngine",
    "SimResult",
    "SimSpeculation",
    "SimTrajectory",
    "SimulatedShapePlanner",
    "Simulator",
    "TrainerModel",
    "heddle_speculation",
    "iteration_policy",
    "judge_colocation",
    "lower_bound",
    "planner_cluster",
    "stream_of",
    "workload_sketch",
]
