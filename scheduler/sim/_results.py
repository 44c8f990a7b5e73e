"""What a simulation reports, and the makespan lower bound every policy is held to."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .._cluster import ClusterSpec
from .._stats import pearson, tail_recall
from .._workload import TrajectoryScript

if TYPE_CHECKING:
    from ._simulator import Simulator

__all__ = ["LowerBound", "SimResult", "lower_bound", "summarise"]


@dataclass(frozen=True)
class SimResult:
    """One policy's simulated rollout. Times in seconds, lengths in output tokens."""

    policy: str
    shape: str
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
    events: int
    predictor: dict[str, dict[str, float]] = field(default_factory=dict)
    utilisation: list[tuple[float, float]] = field(default_factory=list)  # (t, busy GPU share)
    completion_s: list[float] = field(default_factory=list)  # sorted finish times (CDF)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _utilisation(sim: Simulator, makespan: float, bins: int = 100) -> list[tuple[float, float]]:
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


def _predictor_quality(sim: Simulator) -> dict[str, dict[str, float]]:
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


def summarise(sim: Simulator, events: int) -> SimResult:
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
        reshapes=int(sim.shape != sim.cluster.baseline_shape()),
        recompute_tokens=max(0, sum(s.prefill_tokens for s in sims) - first_prefill),
        events=events,
        predictor=_predictor_quality(sim),
        utilisation=_utilisation(sim, makespan),
        completion_s=[float(x) for x in completion[::step]] + [makespan],
    )


@dataclass(frozen=True)
class LowerBound:
    """``max(serial_s, work_s)``: no schedule on this cluster can finish sooner.

    ``serial_s``: the slowest trajectory run alone on its fastest TP degree,
    tools included. ``work_s``: the GPU-seconds every token needs at the best
    case (full batches at the batch cap, weights and its own context read once
    per token, prompts prefilled once), spread over all GPUs.
    """

    serial_s: float
    work_s: float

    @property
    def bound_s(self) -> float:
        return max(self.serial_s, self.work_s)


def _serial_time(script: TrajectoryScript, cluster: ClusterSpec) -> float:
    perf = cluster.perf_model()
    best = math.inf
    for tp in cluster.tensor_parallel_sizes:
        if perf.kv_capacity_tokens(tp) <= 0:
            continue
        t = perf.prefill_time(script.prompt_tokens, tp)
        context = script.prompt_tokens
        for i, tokens in enumerate(script.turn_tokens):
            t += perf.segment_time(1, context, tp, tokens)
            context += tokens
            if i < len(script.tool_latency_s):
                t += script.tool_latency_s[i]
                context += script.tool_output_tokens[i]
        best = min(best, t)
    return best


def lower_bound(scripts: Sequence[TrajectoryScript], cluster: ClusterSpec) -> LowerBound:
    perf = cluster.perf_model()
    hw, model = perf.hardware, perf.model
    bandwidth = hw.hbm_bandwidth_gbps * 1e9 * hw.bandwidth_efficiency
    flops = hw.bf16_tflops * 1e12 * hw.compute_efficiency
    # GPU-seconds per token at TP1 (the cheapest per GPU), full batch of batch_cap.
    per_token_fixed = (model.weight_bytes / bandwidth + perf._fixed_time(1, 1)) / perf.batch_cap
    total_tokens = 0
    context_token_sum = 0.0  # sum over generated tokens of the context each one reads
    prefill_tokens = 0
    for s in scripts:
        context = s.prompt_tokens
        prefill_tokens += s.prompt_tokens + sum(s.tool_output_tokens)
        for i, n in enumerate(s.turn_tokens):
            context_token_sum += n * context + n * (n - 1) / 2.0
            context += n
            if i < len(s.tool_output_tokens):
                context += s.tool_output_tokens[i]
        total_tokens += s.total_tokens
    memory_gpu_s = total_tokens * per_token_fixed + context_token_sum * model.kv_bytes_per_token / (
        bandwidth
    )
    compute_gpu_s = 2.0 * model.params_billion * 1e9 * total_tokens / flops
    prefill_gpu_s = 2.0 * model.params_billion * 1e9 * prefill_tokens / flops
    work = (max(memory_gpu_s, compute_gpu_s) + prefill_gpu_s) / cluster.gpus
    # Only the longest trajectories (by tokens or by tool time) can decide the serial bound.
    by_tokens = sorted(scripts, key=lambda s: -s.total_tokens)[:32]
    by_tools = sorted(scripts, key=lambda s: -sum(s.tool_latency_s))[:32]
    serial = max(
        _serial_time(s, cluster) for s in {id(s): s for s in by_tokens + by_tools}.values()
    )
    return LowerBound(serial_s=serial, work_s=work)
