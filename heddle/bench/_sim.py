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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from heddle.exceptions import ConfigError
from heddle.rollout import load_bench_workload, load_cluster
from heddle.scheduler import (
    BASELINES,
    HEDDLE_SPECULATION,
    AcceptanceModel,
    ClusterSpec,
    PoolShape,
    SpeculationConfig,
    TrajectoryScript,
    acceptance_model,
    get_policy,
)
from heddle.scheduler.sim import (
    SimConfig,
    SimResult,
    SimSpeculation,
    Simulator,
    heddle_speculation,
    lower_bound,
)

__all__ = [
    "ABLATION",
    "DEFAULT_CAPS",
    "HEDDLE_SPECULATION",
    "SPECULATION_SWEEP",
    "Progress",
    "Run",
    "baseline_runs",
    "parse_speculation",
    "run_rollout_bench",
]

ABLATION = ("heddle-order", "heddle-place", "heddle-migrate", "heddle", "heddle-dynamic")
# In-flight caps per engine the baselines are tried with (None: every trajectory at once).
DEFAULT_CAPS: tuple[int | None, ...] = (None, 64, 128)
OFF = SpeculationConfig("off", None)
# Stock vLLM speculation the baselines are swept with by ``--speculation sweep``.
SPECULATION_SWEEP: tuple[SpeculationConfig, ...] = (
    OFF,
    SpeculationConfig("ngram", 4),
    SpeculationConfig("suffix", 2),
    SpeculationConfig("suffix", 4),
    SpeculationConfig("suffix", 8),
)


def parse_speculation(text: str) -> tuple[SpeculationConfig, ...]:
    """``off,ngram:4,suffix:2`` (or ``sweep``): the baselines' speculation axis."""
    if text.strip() == "sweep":
        return SPECULATION_SWEEP
    out: list[SpeculationConfig] = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        method, _, k = word.partition(":")
        if method == "off" and not k:
            out.append(OFF)
            continue
        if method not in ("ngram", "suffix") or not k.isdigit():
            raise ConfigError(
                f"--speculation {text!r}: write off, sweep, or METHOD:K items with METHOD "
                "ngram or suffix, e.g. off,ngram:4,suffix:4"
            )
        out.append(SpeculationConfig(method, int(k)))
    if not out:
        raise ConfigError(f"--speculation {text!r}: name at least one setting, e.g. off")
    return tuple(out)


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


def _acceptance(name: str) -> AcceptanceModel:
    try:
        return acceptance_model(name)
    except ConfigError as exc:
        raise ConfigError(f"--{exc}") from None


def _sim_speculation(run: Run, model: AcceptanceModel) -> SimSpeculation | None:
    if not run.speculation.enabled:
        return None
    # Heddle seeds its engines' drafting corpus and may keep GRPO groups on one engine;
    # the baselines run stock vLLM and route as they do.
    if run.policy.startswith("heddle"):
        return heddle_speculation(run.speculation, model)
    return SimSpeculation(run.speculation, model)


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


@dataclass(frozen=True)
class Run:
    """One simulated configuration: a policy, and for baselines a homogeneous shape and cap."""

    policy: str
    shape: PoolShape | None = None  # None: the policy's own (planned, or the cluster's baseline)
    cap: int | None = None  # trajectories in flight per engine (SimConfig)
    speculation: SpeculationConfig = OFF

    @property
    def key(self) -> str:
        spec = f" {self.speculation.label()}" if self.speculation.enabled else ""
        if self.shape is None:
            return self.policy + spec
        return f"{self.policy} {self.shape}" + (f" cap{self.cap}" if self.cap else "") + spec


def baseline_runs(
    baselines: Sequence[str],
    cluster: ClusterSpec,
    scripts: Sequence[TrajectoryScript],
    caps: Sequence[int | None],
    speculation: Sequence[SpeculationConfig] = (OFF,),
) -> list[Run]:
    """Every baseline at every homogeneous TP the pool allows and the workload fits, per cap."""
    perf = cluster.perf_model()
    longest = max(s.prompt_tokens + s.total_tokens + sum(s.tool_output_tokens) for s in scripts)
    tps = [
        tp
        for tp in cluster.tensor_parallel_sizes
        if cluster.gpus % tp == 0 and perf.kv_capacity_tokens(tp) >= longest
    ]
    if not tps:
        raise ConfigError(
            f"no TP degree of {list(cluster.tensor_parallel_sizes)} holds this workload's longest "
            f"context ({longest} tokens) on {cluster.model}"
        )
    return [
        Run(name, PoolShape.of({tp: cluster.gpus // tp}), cap, spec)
        for name in baselines
        for tp in tps
        for cap in caps
        for spec in speculation
    ]


def run_rollout_bench(
    *,
    workload: str,
    cluster: str,
    policies: Sequence[str],
    seed: int = 1,
    prompts: int | None = None,
    gpus: int | None = None,
    caps: Sequence[int | None] = DEFAULT_CAPS,
    out: Path | None = None,
    progress: bool = True,
    speculation: Sequence[SpeculationConfig] | None = None,
    acceptance: str = "default",
) -> dict[str, Any]:
    """Simulate ``workload`` on ``cluster``: Heddle's policies as they plan themselves, every
    baseline at every homogeneous TP degree, in-flight cap and speculation setting
    (``speculation``; default: the cluster's ``speculation``, else off); return the report.

    Where any baseline speculates, Heddle does too (:data:`HEDDLE_SPECULATION`), all with
    the ``acceptance`` preset's tokens per step."""
    for name in policies:
        get_policy(name)  # fail fast, listing the valid names
    bench = load_bench_workload(workload, seed, prompts)
    cluster_spec = load_cluster(cluster)
    if gpus is not None:
        cluster_spec = replace(cluster_spec, gpus=gpus)
    scripts = bench.scripts
    bound = lower_bound(scripts, cluster_spec)
    if speculation is None:
        speculation = (cluster_spec.speculation or OFF,)
    model = _acceptance(acceptance)
    speculating = any(s.enabled for s in speculation)
    heddle_spec = HEDDLE_SPECULATION if speculating else OFF
    baselines = [n for n in policies if n in BASELINES]
    runs = [Run(n, speculation=heddle_spec) for n in policies if n not in BASELINES]
    runs += baseline_runs(baselines, cluster_spec, scripts, caps, speculation)
    results: dict[str, SimResult] = {}
    walls: dict[str, float] = {}
    for run in runs:
        started = time.perf_counter()
        sim = Simulator(
            scripts,
            cluster_spec,
            get_policy(run.policy),
            tool_means_s=bench.tool_means_s,
            history=bench.history,
            shape=run.shape,
            config=SimConfig(
                max_trajectories_per_engine=run.cap,
                speculation=_sim_speculation(run, model),
            ),
        )
        results[run.key] = sim.run(Progress(run.key) if progress else None)
        walls[run.key] = time.perf_counter() - started
    report: dict[str, Any] = {
        "workload": bench.name,
        "cluster": cluster_spec.name,
        "gpus": cluster_spec.gpus,
        "model": cluster_spec.model,
        "trajectories": len(scripts),
        "seed": seed,
        "acceptance": {"preset": model.name, "source": model.source_note},
        "lower_bound": {
            "makespan_s": bound.bound_s,
            "serial_s": bound.serial_s,
            "work_s": bound.work_s,
        },
        "runs": {
            run.key: {
                "policy": run.policy,
                "tp": None if run.shape is None else run.shape.tps()[0],
                "cap": run.cap,
                "speculation": run.speculation.method,
                "num_speculative_tokens": (
                    None
                    if not run.speculation.enabled
                    else run.speculation.num_speculative_tokens or "auto"
                ),
            }
            for run in runs
        },
        "policies": {key: {**r.as_dict(), "wall_s": walls[key]} for key, r in results.items()},
    }
    report["summary"] = _summary(report, runs, results, cluster_spec, bound.bound_s)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    return report


def _summary(
    report: dict[str, Any],
    runs: Sequence[Run],
    results: dict[str, SimResult],
    cluster: ClusterSpec,
    bound_s: float,
) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    baseline_runs_ = [r for r in runs if r.policy in BASELINES]
    heddle_run = next((r for r in runs if r.policy == "heddle"), None)
    heddle = None if heddle_run is None else results.get(heddle_run.key)
    plain = [r for r in baseline_runs_ if not r.speculation.enabled]
    if plain and len(plain) < len(baseline_runs_):
        best_plain = max(plain, key=lambda r: results[r.key].tokens_per_s)
        summary["best_tuned_baseline_without_speculation"] = report["runs"][best_plain.key] | {
            "key": best_plain.key
        }
        if heddle is not None:
            summary["heddle_over_best_without_speculation"] = _ratio(
                heddle.tokens_per_s, results[best_plain.key].tokens_per_s
            )
    if baseline_runs_:
        best = max(baseline_runs_, key=lambda r: results[r.key].tokens_per_s)
        summary["best_tuned_baseline"] = report["runs"][best.key] | {"key": best.key}
        # The paper's configuration: its baseline TP, no in-flight cap.
        paper = [
            r
            for r in baseline_runs_
            if r.cap is None
            and r.shape is not None
            and r.shape.tps()[0] == cluster.baseline_tp
            and not r.speculation.enabled
        ]
        if paper:
            best_paper = max(paper, key=lambda r: results[r.key].tokens_per_s)
            summary["paper_config_baseline"] = report["runs"][best_paper.key] | {
                "key": best_paper.key
            }
        if heddle is not None:
            summary["heddle_over_best_tuned_baseline"] = _ratio(
                heddle.tokens_per_s, results[best.key].tokens_per_s
            )
            if paper:
                summary["heddle_over_paper_config_baseline"] = _ratio(
                    heddle.tokens_per_s, results[best_paper.key].tokens_per_s
                )
    if heddle is not None:
        summary["lower_bound_over_heddle_makespan"] = _ratio(bound_s, heddle.makespan_s)
    summary["makespan_over_lower_bound"] = {
        key: _ratio(r.makespan_s, bound_s) for key, r in results.items()
    }
    return summary


def format_table(report: dict[str, Any]) -> str:
    """The benchmark's result as a plain-text table."""
    lines = [
        f"{report['workload']} on {report['cluster']} ({report['gpus']} GPUs, {report['model']}), "
        f"{report['trajectories']} trajectories, seed {report['seed']}",
        f"{'run':30s} {'tokens/s':>10s} {'makespan':>9s} {'p50':>8s} "
        f"{'p99':>8s} {'longest q':>9s} {'migr':>6s} {'wall':>6s}",
    ]
    for name, r in report["policies"].items():
        label = name if " " in name else f"{name} {r['shape']}"
        lines.append(
            f"{label:30s} {r['tokens_per_s']:10.0f} {r['makespan_s']:8.1f}s "
            f"{r['p50_completion_s']:7.1f}s {r['p99_completion_s']:7.1f}s "
            f"{r['longest_queue_delay_s']:8.1f}s {r['migrations']:6d} {r['wall_s']:5.1f}s"
        )
    bound = report["lower_bound"]
    lines.append(
        f"{'lower bound':30s} {'':>10s} {bound['makespan_s']:8.1f}s "
        f"(serial {bound['serial_s']:.1f}s, work {bound['work_s']:.1f}s)"
    )
    summary = report["summary"]
    if "best_tuned_baseline" in summary:
        lines.append(f"best-tuned baseline: {summary['best_tuned_baseline']['key']}")
    if "heddle_over_best_tuned_baseline" in summary:
        lines.append(
            f"heddle / best-tuned baseline: {summary['heddle_over_best_tuned_baseline']:.2f}x "
            "tokens/s"
        )
    if "heddle_over_best_without_speculation" in summary:
        lines.append(
            f"heddle / best-tuned baseline without speculation "
            f"({summary['best_tuned_baseline_without_speculation']['key']}): "
            f"{summary['heddle_over_best_without_speculation']:.2f}x tokens/s"
        )
    if "heddle_over_paper_config_baseline" in summary:
        lines.append(
            f"heddle / best baseline at the paper's TP "
            f"({summary['paper_config_baseline']['key']}): "
            f"{summary['heddle_over_paper_config_baseline']:.2f}x tokens/s"
        )
    if "lower_bound_over_heddle_makespan" in summary:
        lines.append(
            f"lower bound / heddle makespan: {summary['lower_bound_over_heddle_makespan']:.2f}"
        )
    return "\n".join(lines)


def _plotted(report: dict[str, Any]) -> list[str]:
    """Heddle's runs, the best-tuned baseline and the paper-configuration baseline."""
    summary = report["summary"]
    keys = [k for k, run in report["runs"].items() if run["tp"] is None]
    for label in ("best_tuned_baseline", "paper_config_baseline"):
        if label in summary and summary[label]["key"] not in keys:
            keys.append(summary[label]["key"])
    return keys


def plot(report: dict[str, Any], path: Path) -> bool:
    """Completion-time CDF and utilisation per policy; False when matplotlib is missing."""
    try:
        import matplotlib  # noqa: PLC0415 - optional dependency (heddle[plot])

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    fig, (cdf, util) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name in _plotted(report):
        r = report["policies"][name]
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
