"""What a simulation reports."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .._cluster import ClusterSpec
from .._policies import SchedulingPolicy
from .._predictor import LengthPredictor
from .._stats import pearson, tail_recall
from .._types import PoolShape
from ._entities import SimEngine, SimTrajectory
from ._speculation import EngineSpeculator, SimSpeculation

__all__ = ["SimResult", "summarise"]


@dataclass(frozen=True)
class SimResult:
    """One policy's simulated rollout. Times in seconds, lengths in output tokens."""

    policy: str
    shape: str
    # What ran: the policy's own scheduling, or the shape planner's step-centric fallback
    # (e.g. "verl cap128") where trajectory scheduling was predicted not to help.
    scheduling: str
    makespan_s: float
    tokens: int
    tokens_per_s: float
    p50_completion_s: float
    p99_completion_s: float
    longest_tokens: int
    longest_finish_s: float
    longest_queue_delay_s: float  # time the longest trajectory's steps waited for admission
    migrations: int
    preemptions: int
    reshapes: int
    recompute_tokens: int  # prefill beyond each trajectory's first prompt (cache misses)
    shared_prompt_tokens: int  # prompt tokens a sibling held in the prefix cache, not prefilled
    events: int
    # Seconds charged before the first step for the start-up decisions' mini-simulations
    # (the shape planner, the co-location verdict; PlannerCost.simulated_event_s).
    decisions_s: float = 0.0
    predictor: dict[str, dict[str, float]] = field(default_factory=dict)
    utilisation: list[tuple[float, float]] = field(default_factory=list)  # (t, busy GPU share)
    completion_s: list[float] = field(default_factory=list)  # sorted finish times (CDF)
    # Speculative decoding: the engines' method and K ("auto": chosen by batch size),
    # output tokens per sequence per verifying step, the share of decode steps that
    # verified drafts, and whether GRPO groups were co-located.
    speculation: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class _RunConfig(Protocol):
    @property
    def max_trajectories_per_engine(self) -> int | None: ...
    @property
    def quality_steps(self) -> tuple[int, ...]: ...
    @property
    def speculation(self) -> SimSpeculation | None: ...


class Simulation(Protocol):
    """What the report reads of a finished run (the simulator, which imports this module)."""

    @property
    def policy(self) -> SchedulingPolicy: ...
    @property
    def fallback_policy(self) -> str | None: ...
    @property
    def config(self) -> _RunConfig: ...
    @property
    def cluster(self) -> ClusterSpec: ...
    @property
    def shape(self) -> PoolShape: ...
    @property
    def predictor(self) -> LengthPredictor | None: ...
    @property
    def sims(self) -> Mapping[str, SimTrajectory]: ...
    @property
    def engines(self) -> Mapping[str, SimEngine]: ...
    @property
    def speculator(self) -> EngineSpeculator | None: ...
    @property
    def migrations(self) -> int: ...
    @property
    def reshaped(self) -> bool: ...
    @property
    def merges(self) -> Sequence[object]: ...
    @property
    def colocation(self) -> str: ...
    @property
    def decisions_s(self) -> float: ...


def _scheduling(sim: Simulation) -> str:
    if sim.fallback_policy is None:
        return sim.policy.name
    cap = sim.config.max_trajectories_per_engine
    return sim.fallback_policy + (f" cap{cap}" if cap else "")


def _utilisation(sim: Simulation, makespan: float, bins: int = 100) -> list[tuple[float, float]]:
    edges = np.linspace(0.0, makespan, bins + 1)
    busy = np.zeros(bins)
    for engine in sim.engines.values():
        for start, end in engine.busy_intervals:
            lo = np.clip(edges[:-1], start, end)
            hi = np.clip(edges[1:], start, end)
            busy += (hi - lo) * engine.instance.tp
    width = makespan / bins if makespan > 0 else 1.0
    share = busy / (sim.cluster.gpus * width)
    return [(float(t), float(u)) for t, u in zip(edges[:-1], share, strict=True)]


def _predictor_quality(sim: Simulation) -> dict[str, dict[str, float]]:
    if sim.predictor is None:
        return {}
    truth = np.array([s.script.total_tokens for s in sim.sims.values()], dtype=np.float64)
    report: dict[str, dict[str, float]] = {}
    for k in sim.config.quality_steps:
        alive = [i for i, s in enumerate(sim.sims.values()) if k in s.predicted_total_at_step]
        predicted = truth.copy()
        values = [s.predicted_total_at_step.get(k) for s in sim.sims.values()]
        for i in alive:
            value = values[i]
            assert value is not None
            predicted[i] = value
        report[f"step_{k}"] = {
            "pearson_all": pearson(predicted, truth),
            "tail_recall_all": tail_recall(predicted, truth),
            "pearson_alive": pearson(predicted[alive], truth[alive]),
            "tail_recall_alive": tail_recall(predicted[alive], truth[alive]),
            "alive": float(len(alive)),
        }
    return report


def summarise(sim: Simulation, events: int) -> SimResult:
    sims = list(sim.sims.values())
    finish = np.array([s.finish_s for s in sims], dtype=np.float64)
    makespan = float(finish.max())
    tokens = sum(s.script.total_tokens for s in sims)
    longest = max(sims, key=lambda s: (s.script.total_tokens, s.id))
    first_prefill = sum(s.script.prompt_tokens + sum(s.script.tool_output_tokens) for s in sims)
    completion = np.sort(finish)
    step = max(1, len(completion) // 200)
    return SimResult(
        policy=sim.policy.name,
        shape=str(sim.shape),
        scheduling=_scheduling(sim),
        makespan_s=makespan,
        tokens=tokens,
        tokens_per_s=tokens / makespan if makespan > 0 else math.inf,
        p50_completion_s=float(np.percentile(finish, 50)),
        p99_completion_s=float(np.percentile(finish, 99)),
        longest_tokens=longest.script.total_tokens,
        longest_finish_s=float(longest.finish_s or math.nan),
        longest_queue_delay_s=longest.queue_delay_s,
        migrations=sim.migrations,
        preemptions=sum(e.preemptions for e in sim.engines.values()),
        reshapes=int(sim.reshaped) + len(sim.merges),
        recompute_tokens=max(
            0, sum(s.prefill_tokens + s.shared_prompt_tokens for s in sims) - first_prefill
        ),
        shared_prompt_tokens=sum(s.shared_prompt_tokens for s in sims),
        events=events,
        decisions_s=sim.decisions_s,
        predictor=_predictor_quality(sim),
        utilisation=_utilisation(sim, makespan),
        completion_s=[float(x) for x in completion[::step]] + [makespan],
        speculation=_speculation(sim),
    )


def _speculation(sim: Simulation) -> dict[str, Any]:
    spec = sim.config.speculation
    if spec is None or not spec.config.enabled:
        return {"method": "off", "num_speculative_tokens": None, "tokens_per_step": 1.0}
    engines = list(sim.engines.values())
    steps = sum(e.spec_steps for e in engines)
    tokens = sum(e.spec_tokens for e in engines)
    k = spec.config.num_speculative_tokens
    k_segments = sim.speculator.k_steps if sim.speculator is not None else {}
    measured = list(sim.speculator.measured.values()) if sim.speculator is not None else []
    fitted = sorted(t.alpha for t in measured if t.alpha is not None)
    alphas = None
    if fitted:
        alphas = {
            "engines": len(fitted),
            "min": fitted[0],
            "median": fitted[len(fitted) // 2],
            "max": fitted[-1],
            "rebuilds": sum(t.rebuilds for t in measured),
        }
    return {
        "method": spec.config.method,
        "num_speculative_tokens": "auto" if k is None else k,
        "tokens_per_step": tokens / steps if steps else 1.0,
        "acceptance": spec.acceptance.name,
        "k_segments": {str(key): n for key, n in sorted(k_segments.items())},
        "colocation": sim.colocation,
        # With k_measured: the acceptance each engine's last table was built on.
        "measured_alpha": alphas,
        "seeded": {
            "siblings": spec.seed_siblings,
            "history_samples": spec.seed_history,
            "k_table": spec.k_table,
            "k_measured": spec.k_measured,
            "tokens": sim.speculator.seeded_tokens if sim.speculator is not None else 0.0,
            "engine_s": sim.speculator.seed_s if sim.speculator is not None else 0.0,
        },
    }
