"""``heddle bench --iterations N --max-staleness S``: rollouts and training over N iterations.

Every policy of :data:`heddle.scheduler.sim.ITERATION_POLICIES` runs the same
stream of GRPO groups (draws ``seed``, ``seed + 1``, ... of the workload, one
batch of ``prompts`` groups per draw) through :class:`IterationSimulator`, each
at every configuration its users tune: the synchronous baselines at every
in-flight cap, the disaggregated ones at every rollout/trainer split and cap,
the partial-rollout ones at every over-sampling factor and cap. The best configuration of
each policy by trained samples per second is its figure. Length bias: the mean
and p90 output length of the samples each policy trained on, against the
synchronous best-tuned run's (which trains on whole draws, so on the workload's
own distribution). docs/async.md.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from heddle.exceptions import ConfigError
from heddle.rollout import load_bench_workload, load_cluster
from heddle.scheduler.sim import (
    ITERATION_POLICIES,
    IterationSimulator,
    TrainerModel,
    iteration_policy,
    stream_of,
)

__all__ = [
    "ASYNC_BASELINES",
    "ITERATION_CAPS",
    "SYNC_BASELINES",
    "IterationRun",
    "format_iterations",
    "iteration_report",
    "iteration_runs",
    "run_iteration_bench",
]

SYNC_BASELINES = ("verl", "verl-star", "slime")
ASYNC_BASELINES = ("verl-async", "areal", "slime-partial")
# What each family is tuned over (the defaults of `heddle bench --iterations`).
ITERATION_CAPS: tuple[int | None, ...] = (None, 128)
DEFAULT_ROLLOUT_SHARES: tuple[float, ...] = (0.625, 0.75, 0.875)
DEFAULT_OVER_SAMPLES: tuple[float, ...] = (0.25, 0.5, 1.0)


@dataclass(frozen=True)
class IterationRun:
    """One configuration of one policy."""

    policy: str
    cap: int | None = None
    rollout_gpus: int | None = None
    over_sample: float | None = None

    @property
    def key(self) -> str:
        parts = [self.policy]
        if self.cap is not None:
            parts.append(f"cap{self.cap}")
        if self.rollout_gpus is not None:
            parts.append(f"rollout{self.rollout_gpus}")
        if self.over_sample is not None:
            parts.append(f"over{self.over_sample:g}")
        return " ".join(parts)


def iteration_runs(
    policies: Sequence[str],
    gpus: int,
    rollout_tp: int,
    *,
    caps: Sequence[int | None] = ITERATION_CAPS,
    rollout_shares: Sequence[float] = DEFAULT_ROLLOUT_SHARES,
    over_samples: Sequence[float] = DEFAULT_OVER_SAMPLES,
) -> list[IterationRun]:
    """Every configuration each policy is tuned over."""
    runs: list[IterationRun] = []
    splits = sorted(
        {max(rollout_tp, rollout_tp * round(share * gpus / rollout_tp)) for share in rollout_shares}
        - {gpus}
    )
    for name in policies:
        if name not in ITERATION_POLICIES:
            raise ConfigError(
                f"unknown policy {name!r} for --iterations; valid: {', '.join(ITERATION_POLICIES)}"
            )
        # The in-flight cap is every family's knob (verl's and slime's rollout concurrency,
        # AReaL's max_concurrent_rollouts, the fully-async rollouter's concurrency).
        if name in SYNC_BASELINES:
            runs += [IterationRun(name, cap=c) for c in caps]
        elif name in ("verl-async", "areal"):
            if not splits:
                raise ConfigError(f"{gpus} GPUs leave no rollout/trainer split at TP{rollout_tp}")
            runs += [IterationRun(name, cap=c, rollout_gpus=r) for r in splits for c in caps]
        else:
            runs += [IterationRun(name, cap=c, over_sample=o) for o in over_samples for c in caps]
    return runs


@dataclass(frozen=True)
class _Task:
    run: IterationRun
    workload: str
    cluster: str
    gpus: int | None
    seed: int
    prompts: int | None
    iterations: int
    max_staleness: int
    rollout_tp: int
    trainer: TrainerModel


def _simulate(task: _Task) -> tuple[str, dict[str, Any], float]:
    """One configuration, from the workload up (a worker process builds its own)."""
    started = time.perf_counter()
    cluster = load_cluster(task.cluster)
    if task.gpus is not None:
        cluster = replace(cluster, gpus=task.gpus)
    run = task.run
    policy = iteration_policy(
        run.policy,
        task.max_staleness,
        rollout_gpus=run.rollout_gpus,
        cap=run.cap,
        over_sample=run.over_sample,
    )
    # Enough draws for every batch the trainer takes plus what over-sampling and the
    # admission window launch ahead of it.
    ahead = max(policy.over_sample, policy.window_batches) + 1.0
    draws = [
        load_bench_workload(task.workload, task.seed + k, task.prompts)
        for k in range(task.iterations + math.ceil(ahead) + 1)
    ]
    groups = stream_of([d.scripts for d in draws])
    batch = len(groups) // len(draws)
    sim = IterationSimulator(
        groups,
        cluster,
        policy,
        batch_groups=batch,
        iterations=task.iterations,
        max_staleness=task.max_staleness,
        tool_means_s=draws[0].tool_means_s,
        rollout_tp=task.rollout_tp,
        trainer=task.trainer,
        history=draws[0].history,
    )
    result = sim.run_iterations()
    return run.key, result.as_dict(), time.perf_counter() - started


def run_iteration_bench(
    *,
    workload: str,
    cluster: str,
    policies: Sequence[str],
    iterations: int,
    max_staleness: int,
    seed: int = 1,
    prompts: int | None = None,
    gpus: int | None = None,
    rollout_tp: int = 4,
    caps: Sequence[int | None] = ITERATION_CAPS,
    rollout_shares: Sequence[float] = DEFAULT_ROLLOUT_SHARES,
    over_samples: Sequence[float] = DEFAULT_OVER_SAMPLES,
    trainer: TrainerModel | None = None,
    jobs: int = 1,
    progress: bool = True,
) -> dict[str, Any]:
    """Simulate every configuration of every policy over ``iterations``; return the report."""
    if iterations < 1:
        raise ConfigError(f"--iterations {iterations}: must be at least 1")
    if max_staleness < 0:
        raise ConfigError(f"--max-staleness {max_staleness}: must be at least 0")
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: must be at least 1")
    cluster_spec = load_cluster(cluster)
    pool_gpus = gpus if gpus is not None else cluster_spec.gpus
    runs = iteration_runs(
        policies,
        pool_gpus,
        rollout_tp,
        caps=caps,
        rollout_shares=rollout_shares,
        over_samples=over_samples,
    )
    trainer = trainer or TrainerModel()
    tasks = [
        _Task(
            run,
            workload,
            cluster,
            gpus,
            seed,
            prompts,
            iterations,
            max_staleness,
            rollout_tp,
            trainer,
        )
        for run in runs
    ]
    results: dict[str, dict[str, Any]] = {}
    walls: dict[str, float] = {}

    def record(key: str, result: dict[str, Any], wall: float) -> None:
        results[key] = result
        walls[key] = wall
        if progress:
            sys.stderr.write(
                f"{key}: {result['trained_samples_per_s']:.3f} trained samples/s "
                f"({len(results)}/{len(tasks)}, {wall:.0f}s)\n"
            )

    if jobs == 1:
        for task in tasks:
            record(*_simulate(task))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for key, result, wall in pool.map(_simulate, tasks):
                record(key, result, wall)
    return iteration_report(
        workload=workload,
        cluster=cluster,
        gpus=pool_gpus,
        rollout_tp=rollout_tp,
        iterations=iterations,
        max_staleness=max_staleness,
        seed=seed,
        trainer=trainer,
        runs=runs,
        results=results,
        walls=walls,
    )


def iteration_report(
    *,
    workload: str,
    cluster: str,
    gpus: int,
    rollout_tp: int,
    iterations: int,
    max_staleness: int,
    seed: int,
    trainer: TrainerModel,
    runs: Sequence[IterationRun],
    results: dict[str, dict[str, Any]],
    walls: dict[str, float],
) -> dict[str, Any]:
    """The report (results.json) from each configuration's :class:`IterationResult` dict."""
    cluster_spec = load_cluster(cluster)
    model = cluster_spec.perf_model().model
    report: dict[str, Any] = {
        "workload": workload,
        "cluster": cluster_spec.name,
        "gpus": gpus,
        "model": cluster_spec.model,
        "rollout_tp": rollout_tp,
        "iterations": iterations,
        "max_staleness": max_staleness,
        "seed": seed,
        "trainer": {
            **vars(trainer),
            "seconds_per_token_on_pool": trainer.seconds_per_token(model, gpus),
            "weight_sync_s": trainer.sync_s(model),
        },
        "runs": {key: {**r, "wall_s": walls.get(key, math.nan)} for key, r in results.items()},
    }
    done = [run for run in runs if run.key in results]
    report["policies"] = _best_per_policy(done, results)
    report["summary"] = _summary(report["policies"])
    return report


def _best_per_policy(
    runs: Sequence[IterationRun], results: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for run in runs:
        r = results[run.key]
        if (
            run.policy not in best
            or r["trained_samples_per_s"] > best[run.policy]["trained_samples_per_s"]
        ):
            best[run.policy] = {**r, "key": run.key}
    return best


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def _summary(policies: dict[str, dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    sync = [policies[n] for n in SYNC_BASELINES if n in policies]
    asyn = [policies[n] for n in ASYNC_BASELINES if n in policies]
    heddle = policies.get("heddle")
    best_sync = max(sync, key=lambda r: r["trained_samples_per_s"]) if sync else None
    best_async = max(asyn, key=lambda r: r["trained_samples_per_s"]) if asyn else None
    if best_sync is not None:
        summary["best_sync"] = best_sync["key"]
        summary["length_reference"] = {
            "mean_tokens": best_sync["trained_mean_tokens"],
            "p90_tokens": best_sync["trained_p90_tokens"],
        }
        summary["length_bias"] = {
            name: {
                "mean": _ratio(r["trained_mean_tokens"], best_sync["trained_mean_tokens"]) - 1,
                "p90": _ratio(r["trained_p90_tokens"], best_sync["trained_p90_tokens"]) - 1,
            }
            for name, r in policies.items()
        }
    if best_async is not None:
        summary["best_async"] = best_async["key"]
    if heddle is not None and best_sync is not None:
        summary["heddle_over_best_sync"] = _ratio(
            heddle["trained_samples_per_s"], best_sync["trained_samples_per_s"]
        )
    if heddle is not None and best_async is not None:
        summary["heddle_over_best_async"] = _ratio(
            heddle["trained_samples_per_s"], best_async["trained_samples_per_s"]
        )
    return summary


def format_iterations(report: dict[str, Any]) -> str:
    """The comparison as a plain-text table (best configuration per policy)."""
    summary = report["summary"]
    bias = summary.get("length_bias", {})
    lines = [
        f"{report['workload']} on {report['cluster']} ({report['gpus']} GPUs, TP"
        f"{report['rollout_tp']} engines), {report['iterations']} iterations, "
        f"max staleness {report['max_staleness']}",
        f"{'policy (best configuration)':34s} {'samples/s':>9s} {'elapsed':>8s} "
        f"{'mean len':>9s} {'p90 len':>8s} {'stale max':>9s} {'over':>6s} {'crossed':>7s}",
    ]
    for name, r in report["policies"].items():
        b = bias.get(name, {"mean": math.nan, "p90": math.nan})
        lines.append(
            f"{r['key']:34s} {r['trained_samples_per_s']:9.3f} {r['elapsed_s']:7.0f}s "
            f"{r['trained_mean_tokens']:9.0f} {r['trained_p90_tokens']:8.0f} "
            f"{r['staleness_max']:9d} {r['samples_over_bound']:6d} {r['crossed_versions']:7d}"
            f"   (length {b['mean']:+.1%} mean, {b['p90']:+.1%} p90)"
        )
    if "heddle_over_best_sync" in summary:
        lines.append(
            f"heddle / best synchronous ({summary['best_sync']}): "
            f"{summary['heddle_over_best_sync']:.2f}x trained samples/s"
        )
    if "heddle_over_best_async" in summary:
        lines.append(
            f"heddle / best asynchronous ({summary['best_async']}): "
            f"{summary['heddle_over_best_async']:.2f}x trained samples/s"
        )
    return "\n".join(lines)
