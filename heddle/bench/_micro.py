"""Component benchmarks: placement DP speed, shape search speed, predictor quality.

Each returns a JSON-ready dict; ``heddle bench placement|shape|predictor`` prints
and saves it. Timings are medians over repeats (the machines here are shared).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from heddle.rollout import WORKLOAD_PRESETS, load_bench_workload, load_cluster, load_workload
from heddle.scheduler import (
    AnnealingShapePlanner,
    PoolShape,
    ProgressPredictor,
    ShapeConfig,
    SiblingPredictor,
    Trajectory,
    TrajectoryScript,
    evaluate_predictor,
    generate,
    history_of,
    pearson,
    plan_placement,
    tail_recall,
)

__all__ = ["bench_placement", "bench_predictor", "bench_shape", "chunked"]


def _median_s(fn: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def _lengths(workload: str, count: int, seed: int) -> np.ndarray:
    scripts = generate(load_workload(workload), seed)
    rng = np.random.default_rng(seed)
    totals = np.array([s.total_tokens for s in scripts], dtype=np.float64)
    return rng.choice(totals, size=count, replace=count > totals.size)


def bench_placement(
    *,
    trajectories: int = 4096,
    instances: int = 64,
    tps: Sequence[int] = (1,),
    workload: str = "coding",
    cluster: str = "64xh100",
    repeats: int = 21,
    seed: int = 0,
) -> dict[str, Any]:
    """Placement of ``trajectories`` over ``instances`` engines whose TP degrees cycle
    through ``tps``: the table-free split Heddle plans with, and the paper's DP as the
    exact reference (timed on fewer repeats where it is slow)."""
    perf = load_cluster(cluster).perf_model()
    engines = [perf.instance(f"e{i}", tps[i % len(tps)]) for i in range(instances)]
    lengths = _lengths(workload, trajectories, seed)
    trajs = [Trajectory(f"t{i}", f"g{i // 16}", 512) for i in range(trajectories)]
    for t, length in zip(trajs, lengths, strict=True):
        t.predicted_remaining_tokens = float(length)
    result: dict[str, Any] = {
        "trajectories": trajectories,
        "instances": instances,
        "tps": list(tps),
        "workload": workload,
        "repeats": repeats,
    }
    for label, exact_dp in (("split", False), ("exact_dp", True)):
        plan = plan_placement(trajs, engines, exact_dp=exact_dp)
        # The DP takes seconds at 16K x 256; three repeats are enough to time it.
        runs = repeats if not exact_dp or trajectories * instances <= 4096 * 64 else 3

        def run(exact: bool = exact_dp) -> object:
            return plan_placement(trajs, engines, exact_dp=exact)

        median, times = _median_s(run, runs)
        loads = Counter(plan.assignment.values())
        result[label] = {
            "repeats": runs,
            "median_ms": median * 1e3,
            "min_ms": min(times) * 1e3,
            "predicted_makespan_s": plan.makespan_s,
            "idle_instances": sum(1 for e in engines if loads[e.name] == 0),
        }
    return result


def bench_shape(
    *,
    gpus: int = 64,
    workload: str = "coding",
    cluster: str = "64xh100",
    repeats: int = 5,
    trajectories: int = 4096,
    seed: int = 0,
) -> dict[str, Any]:
    """Annealing shape search for ``gpus`` GPUs on a workload's predicted lengths."""
    spec = load_cluster(cluster)
    perf = spec.perf_model()
    config = ShapeConfig(
        gpu_budget=gpus,
        gpus_per_node=spec.gpus_per_node,
        tensor_parallel_sizes=spec.tensor_parallel_sizes,
        seed=seed,
    )
    planner = AnnealingShapePlanner(perf, config)
    lengths = _lengths(workload, trajectories, seed)
    baseline = PoolShape.of({spec.baseline_tp: gpus // spec.baseline_tp})
    plan = planner.plan(lengths, baseline)
    median, times = _median_s(lambda: planner.plan(lengths, baseline), repeats)
    return {
        "gpus": gpus,
        "workload": workload,
        "trajectories": trajectories,
        "repeats": repeats,
        "median_s": median,
        "min_s": min(times),
        "evaluations": plan.evaluations,
        "baseline_shape": str(baseline),
        "baseline_makespan_s": plan.current_makespan_s,
        "shape": str(plan.shape),
        "predicted_makespan_s": plan.predicted_makespan_s,
        "reshape": plan.reshape,
    }


def chunked(script: TrajectoryScript, size: int) -> TrajectoryScript:
    """``script`` with each step cut into steps of ``size`` tokens (the last one shorter)."""
    turns: list[int] = []
    names: list[str] = []
    latency: list[float] = []
    replies: list[int] = []
    for i, tokens in enumerate(script.turn_tokens):
        parts = [size] * (tokens // size) + ([tokens % size] if tokens % size else [])
        for j, part in enumerate(parts):
            turns.append(part)
            if j < len(parts) - 1:  # a re-prediction point inside the step: no tool
                names.append("none")
                latency.append(0.0)
                replies.append(0)
        if i < len(script.tool_names):
            names.append(script.tool_names[i])
            latency.append(script.tool_latency_s[i])
            replies.append(script.tool_output_tokens[i])
    return replace(
        script,
        turn_tokens=tuple(turns),
        tool_names=tuple(names),
        tool_latency_s=tuple(latency),
        tool_output_tokens=tuple(replies),
        step_token_ids=(),
    )


def bench_predictor(
    *,
    workloads: tuple[str, ...] = ("coding", "search", "math"),
    seed: int = 1,
    steps: tuple[int, ...] = (1, 2, 4),
    history: str | None = None,
    chunk_tokens: int | None = None,
) -> dict[str, Any]:
    """Pearson and tail-20% recall after step k, per workload and predictor.

    ``seeded`` predictors learnt from a previous rollout of the same workload
    (another seed: other prompts), as in RL training, where rollout i+1
    follows rollout i. ``ceiling`` ranks by each group's exact geometric mean
    length: what perfect knowledge of the prompt alone could give.

    A workload that is a ``.jsonl`` trace (a token trace of ``heddle run --trace``, an
    output file, or trajectory rows) is scored on its own trajectories; its ``seeded``
    predictors learn from ``history``, another trace (an earlier rollout of the same
    tasks), and without one only ``cold`` ones run.

    ``chunk_tokens``: cut every LLM step into steps of that many tokens (no tool time
    between them), as if the scheduler re-predicted every ``chunk_tokens`` generated
    tokens; "after step k" then means after ``k * chunk_tokens`` tokens. Single-turn
    outputs have no step boundary before they end, so only this scores a predictor on them.
    """
    report: dict[str, Any] = {
        "seed": seed,
        "steps": list(steps),
        "chunk_tokens": chunk_tokens,
        "workloads": {},
    }
    for name in workloads:
        earlier: list[TrajectoryScript] | None
        if name.endswith(".jsonl") and name not in WORKLOAD_PRESETS:
            scripts = list(load_bench_workload(name, seed).scripts)
            earlier = list(load_bench_workload(history, seed).scripts) if history else None
        else:
            spec = load_workload(name)
            scripts = generate(spec, seed)
            earlier = generate(spec, seed + 1000)
        if chunk_tokens is not None:
            scripts = [chunked(s, chunk_tokens) for s in scripts]
            earlier = None if earlier is None else [chunked(s, chunk_tokens) for s in earlier]
        previous = None if earlier is None else history_of(earlier)
        truth = np.array([s.total_tokens for s in scripts], dtype=np.float64)
        turns = np.array([s.turns for s in scripts])
        entry: dict[str, Any] = {
            "trajectories": len(scripts),
            "groups": len({s.group_id for s in scripts}),
            # After step k only trajectories with more than k steps are predicted at all.
            "share_with_more_steps_than": {
                str(k): float(np.mean(turns > k)) if len(turns) else 0.0 for k in steps
            },
        }
        for predictor_cls in (SiblingPredictor, ProgressPredictor):
            for seeded in (False, True):
                if seeded and previous is None:
                    continue
                predictor = predictor_cls()
                if seeded and previous is not None:
                    predictor.seed(previous)
                quality = evaluate_predictor(scripts, predictor, steps)
                entry[f"{predictor_cls.name}/{'seeded' if seeded else 'cold'}"] = [
                    vars(q) for q in quality
                ]
        groups: dict[str, list[float]] = {}
        for s in scripts:
            groups.setdefault(s.group_id, []).append(np.log(s.total_tokens))
        ceiling = np.array([np.exp(np.mean(groups[s.group_id])) for s in scripts])
        entry["ceiling_group_mean"] = {
            "pearson": pearson(ceiling, truth),
            "tail_recall": tail_recall(ceiling, truth),
        }
        report["workloads"][name] = entry
    return report
