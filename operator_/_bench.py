"""``heddle bench``: simulate a rollout under several policies in one process and compare.

Writes ``results.json`` (per policy: tokens/s, makespan, completion times,
queueing of the longest trajectory, migrations, reshapes, predictor quality;
plus the makespan lower bound) and, with matplotlib installed, ``rollout.png``
(completion-time CDF and cluster utilisation over time).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from heddle.exceptions import ConfigError
from heddle.scheduler import BASELINES, POLICIES, generate, get_policy, history_of
from heddle.scheduler.sim import SimResult, Simulator, lower_bound

from ._presets import load_cluster, load_workload

__all__ = ["ABLATION", "Progress", "run_rollout_bench"]

ABLATION = ("heddle-order", "heddle-place", "heddle-migrate", "heddle")


class Progress:
    """A one-line progress bar on a terminal; a line per 10% elsewhere (CI logs)."""

    def __init__(self, label: str, stream: TextIO = sys.stderr) -> None:
        self.label = label
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.perf_counter()
        self._last_decile = -1

    def __call__(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        elapsed = time.perf_counter() - self.started
        if self.tty:
            bar = "#" * int(30 * fraction)
            self.stream.write(
                f"\r{self.label:>15s} [{bar:<30s}] {done}/{total} trajectories {elapsed:5.1f}s"
            )
            if done == total:
                self.stream.write("\n")
            self.stream.flush()
        elif int(fraction * 10) > self._last_decile:
            self._last_decile = int(fraction * 10)
            self.stream.write(f"{self.label}: {done}/{total} trajectories ({elapsed:.1f}s)\n")
            self.stream.flush()


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


def run_rollout_bench(
    *,
    workload: str,
    cluster: str,
    policies: Sequence[str],
    seed: int = 1,
    prompts: int | None = None,
    gpus: int | None = None,
    out: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Simulate ``workload`` on ``cluster`` under each policy; return the report."""
    for name in policies:
        get_policy(name)  # fail fast, listing the valid names
    spec = load_workload(workload)
    if prompts is not None:
        if prompts < 1:
            raise ConfigError(f"--prompts {prompts}: must be at least 1")
        spec = replace(spec, prompts=prompts)
    cluster_spec = load_cluster(cluster)
    if gpus is not None:
        cluster_spec = replace(cluster_spec, gpus=gpus)
    scripts = generate(spec, seed)
    # The rollout before this one (other prompts, same distribution): seeds the
    # predictor and the initial shape, as in RL training. Baselines ignore it.
    history = history_of(generate(spec, seed + 1000))
    tool_means = {
        t.name: t.latency_s.median * math.exp(0.5 * t.latency_s.sigma**2) for t in spec.tools
    }
    bound = lower_bound(scripts, cluster_spec)
    results: dict[str, SimResult] = {}
    walls: dict[str, float] = {}
    for name in policies:
        started = time.perf_counter()
        sim = Simulator(
            scripts, cluster_spec, get_policy(name), tool_means_s=tool_means, history=history
        )
        results[name] = sim.run(Progress(name) if progress else None)
        walls[name] = time.perf_counter() - started
    report: dict[str, Any] = {
        "workload": spec.name,
        "cluster": cluster_spec.name,
        "gpus": cluster_spec.gpus,
        "model": cluster_spec.model,
        "trajectories": len(scripts),
        "seed": seed,
        "lower_bound": {
            "makespan_s": bound.bound_s,
            "serial_s": bound.serial_s,
            "work_s": bound.work_s,
        },
        "policies": {name: {**r.as_dict(), "wall_s": walls[name]} for name, r in results.items()},
    }
    baselines = [n for n in policies if n in BASELINES]
    heddle = results.get("heddle")
    summary: dict[str, Any] = {}
    if baselines:
        best = max(baselines, key=lambda n: results[n].tokens_per_s)
        summary["best_baseline"] = best
        if heddle is not None:
            summary["heddle_over_best_baseline"] = _ratio(
                heddle.tokens_per_s, results[best].tokens_per_s
            )
    if heddle is not None:
        summary["lower_bound_over_heddle_makespan"] = _ratio(bound.bound_s, heddle.makespan_s)
    for name, r in results.items():
        summary.setdefault("makespan_over_lower_bound", {})[name] = _ratio(
            r.makespan_s, bound.bound_s
        )
    report["summary"] = summary
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    return report


def format_table(report: dict[str, Any]) -> str:
    """The benchmark's result as a plain-text table."""
    lines = [
        f"{report['workload']} on {report['cluster']} ({report['gpus']} GPUs, {report['model']}), "
        f"{report['trajectories']} trajectories, seed {report['seed']}",
        f"{'policy':15s} {'shape':>26s} {'tokens/s':>10s} {'makespan':>9s} {'p50':>8s} "
        f"{'p99':>8s} {'longest q':>9s} {'migr':>6s} {'wall':>6s}",
    ]
    for name, r in report["policies"].items():
        lines.append(
            f"{name:15s} {r['shape']:>26s} {r['tokens_per_s']:10.0f} {r['makespan_s']:8.1f}s "
            f"{r['p50_completion_s']:7.1f}s {r['p99_completion_s']:7.1f}s "
            f"{r['longest_queue_delay_s']:8.1f}s {r['migrations']:6d} {r['wall_s']:5.1f}s"
        )
    bound = report["lower_bound"]
    lines.append(
        f"{'lower bound':15s} {'':>26s} {'':>10s} {bound['makespan_s']:8.1f}s "
        f"(serial {bound['serial_s']:.1f}s, work {bound['work_s']:.1f}s)"
    )
    summary = report["summary"]
    if "heddle_over_best_baseline" in summary:
        lines.append(
            f"heddle / best baseline ({summary['best_baseline']}): "
            f"{summary['heddle_over_best_baseline']:.2f}x tokens/s"
        )
    if "lower_bound_over_heddle_makespan" in summary:
        lines.append(
            f"lower bound / heddle makespan: {summary['lower_bound_over_heddle_makespan']:.2f}"
        )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> bool:
    """Completion-time CDF and utilisation per policy; False when matplotlib is missing."""
    try:
        import matplotlib  # noqa: PLC0415 - optional dependency (heddle[plot])

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    fig, (cdf, util) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name, r in report["policies"].items():
        times = r["completion_s"]
        fractions = [i / (len(times) - 1) for i in range(len(times))] if len(times) > 1 else [1.0]
        style = "-" if name.startswith("heddle") else "--"
        cdf.plot(times, fractions, style, label=f"{name} ({r['makespan_s']:.0f}s)")
        ts = [t for t, _ in r["utilisation"]]
        us = [u for _, u in r["utilisation"]]
        util.plot(ts, us, style, label=name)
    bound = report["lower_bound"]["makespan_s"]
    cdf.axvline(bound, color="grey", linestyle=":", label=f"lower bound ({bound:.0f}s)")
    cdf.set(xlabel="time (s)", ylabel="trajectories finished", title="Completion-time CDF")
    util.set(
        xlabel="time (s)", ylabel="busy share of GPUs", title="Cluster utilisation", ylim=(0, 1.05)
    )
    cdf.legend(fontsize=8)
    util.legend(fontsize=8)
    fig.suptitle(
        f"{report['workload']}: {report['trajectories']} trajectories on {report['gpus']} GPUs "
        f"({report['model']}, simulated)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def known_policies() -> list[str]:
    return sorted(POLICIES)
