"""The paper-scale speculation runs of docs/speculation.md, in parallel processes.

Each run is the ``Simulator`` call ``heddle bench`` makes for that row (same
workload, seed 1, cluster, policy, shape, in-flight cap and speculation; see
docs/speculation.md for the equivalent ``heddle bench`` commands). It reads the
presets from specs.json (the YAML presets as JSON, so it also runs where only
numpy is installed) and appends one JSON line per run to OUT/runs.jsonl.

    python examples/spec-trace/paper_runs.py OUT [PROCESSES] [DEADLINE_S] [SCALE]

SCALE: ``small`` (2,048 on 16), ``paper`` (8,192 on 64), ``both``, ``issue26``
(the runs of the tables after the co-location decision and the drafting corpus),
``no-history`` (Heddle's rows of those tables without the previous rollout, which a
job's first iteration does not have: docs/speculation.md, "Without the previous
rollout"), ``heddle`` (Heddle's rows of the main tables, the sensitivity table and
the presets no speculation code was tuned on; the baselines' rows do not change when
only Heddle's code does), or ``findings`` (the findings table's rows, one mechanism at
a time, the K-per-segment row left out: it drafts by no table).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SPECS = json.loads((HERE / "specs.json").read_text())

# (workload, cluster, prompts, gpus, baseline policy, cap) per workload: the best-tuned
# configuration of the full sweep without speculation (docs/benchmarks.md).
WORKLOADS = {
    "coding": ("cluster-tp4", None, None, "verl", 128),
    "search": ("cluster-tp4", None, None, "verl", None),
    "math": ("cluster-tp4", None, None, "slime", None),
    "flat": ("cluster-tp2", None, None, "verl", 128),
}
DEFAULT_AXIS = ("off", "suffix:4", "suffix:8", "ngram:4", "suffix:2")
PESSIMISTIC_AXIS = ("suffix:4", "suffix:8", "ngram:4")
SENSITIVITY = ("tau:1.0", "tau:1.5", "tau:2.0", "tau:2.5", "tau:3.0")


def configs(scale: str = "both") -> list[dict[str, Any]]:
    """Runs in the order they are worth having: 2,048 trajectories on 16 GPUs (the same
    load per engine), default then pessimistic acceptance, the sensitivity table, then the
    paper's 8,192 on 64."""
    rows: list[dict[str, Any]] = []
    sizes = {"small": [(128, 16)], "paper": [(None, None)], "both": [(128, 16), (None, None)]}
    for prompts, gpus in sizes[scale]:
        for acceptance, axis in (("default", DEFAULT_AXIS), ("pessimistic", PESSIMISTIC_AXIS)):
            for w, (cluster, _, _, policy, cap) in WORKLOADS.items():
                base = {"workload": w, "cluster": cluster, "prompts": prompts, "gpus": gpus}
                rows.append(
                    {**base, "policy": "heddle", "cap": None, "spec": "suffix:auto",
                     "acceptance": acceptance}
                )  # fmt: skip
                rows += [
                    {**base, "policy": policy, "cap": cap, "spec": s, "acceptance": acceptance}
                    for s in axis
                ]
        if prompts is not None:
            for tau in SENSITIVITY:
                base = {"workload": "coding", "cluster": "cluster-tp4", "prompts": prompts,
                        "gpus": gpus}  # fmt: skip
                rows.append(
                    {**base, "policy": "heddle", "cap": None, "spec": "suffix:auto",
                     "acceptance": tau}
                )  # fmt: skip
                rows += [
                    {**base, "policy": "verl", "cap": 128, "spec": s, "acceptance": tau}
                    for s in ("suffix:4", "suffix:8")
                ]
    return rows


HEDDLE = {"policy": "heddle", "cap": None, "spec": "suffix:auto"}
# The findings table: Heddle with one mechanism at a time (docs/speculation.md).
ABLATIONS = {
    "k-per-segment": {"colocate_groups": False, "seed_siblings": False, "seed_history": 0,
                      "k_table": False},
    "k-table": {"colocate_groups": False, "seed_siblings": False, "seed_history": 0},
    "k-table+siblings": {"colocate_groups": False, "seed_history": 0},
    "k-table+history": {"colocate_groups": False, "seed_siblings": False},
    "colocation-judged": {"seed_siblings": False, "seed_history": 0},
    "k-table-fixed": {"k_measured": False},
}  # fmt: skip


def issue26_configs() -> list[dict[str, Any]]:
    """The runs of docs/speculation.md's tables after the co-location decision and the
    drafting corpus (issue 26), most wanted first: Heddle at the paper's scale, the
    baselines there with the pessimistic acceptance, both at 2,048 on 16, the findings
    (one mechanism at a time), the sensitivity table, and the baselines' wider sweep
    (verl and slime, uncapped and at cap 128, K 2/4/8) at 2,048 on 16."""
    rows: list[dict[str, Any]] = []
    paper = {"prompts": None, "gpus": None}
    small = {"prompts": 128, "gpus": 16}
    for acceptance in ("default", "pessimistic"):
        for w, (cluster, *_rest) in WORKLOADS.items():
            rows.append({"workload": w, "cluster": cluster, **paper, **HEDDLE,
                         "acceptance": acceptance})  # fmt: skip
    for w, (cluster, _, _, policy, cap) in WORKLOADS.items():
        for s in ("suffix:2", "suffix:4", "suffix:8", "ngram:4"):
            rows.append({"workload": w, "cluster": cluster, **paper, "policy": policy,
                         "cap": cap, "spec": s, "acceptance": "pessimistic"})  # fmt: skip
    for acceptance in ("default", "pessimistic"):
        for w, (cluster, *_rest) in WORKLOADS.items():
            rows.append({"workload": w, "cluster": cluster, **small, **HEDDLE,
                         "acceptance": acceptance})  # fmt: skip
    for w, (cluster, _, _, policy, cap) in WORKLOADS.items():
        rows.append({"workload": w, "cluster": cluster, **small, "policy": policy,
                     "cap": cap, "spec": "suffix:2", "acceptance": "pessimistic"})  # fmt: skip
    for size in (small, paper):
        for w, (cluster, *_rest) in WORKLOADS.items():
            for name, knobs in ABLATIONS.items():
                rows.append({"workload": w, "cluster": cluster, **size, **HEDDLE,
                             "acceptance": "default", "ablation": name, **knobs})  # fmt: skip
    for tau in SENSITIVITY:
        rows.append({"workload": "coding", "cluster": "cluster-tp4", **small, **HEDDLE,
                     "acceptance": tau})  # fmt: skip
    for w, (cluster, *_rest) in WORKLOADS.items():
        for policy in ("verl", "slime"):
            for cap in (None, 128):
                for s in ("suffix:2", "suffix:4", "suffix:8"):
                    rows.append({"workload": w, "cluster": cluster, **small, "policy": policy,
                                 "cap": cap, "spec": s, "acceptance": "default"})  # fmt: skip
    return rows


def no_history_configs() -> list[dict[str, Any]]:
    """Heddle's rows of the main tables (both scales and acceptances), no previous rollout."""
    rows: list[dict[str, Any]] = []
    for size in ({"prompts": 128, "gpus": 16}, {"prompts": None, "gpus": None}):
        for acceptance in ("default", "pessimistic"):
            for w, (cluster, *_rest) in WORKLOADS.items():
                rows.append({"workload": w, "cluster": cluster, **size, **HEDDLE,
                             "acceptance": acceptance, "history": False})  # fmt: skip
    return rows


# The presets no speculation code was tuned on, 2,048 on 16 (docs/speculation.md).
UNTUNED = ("bimodal", "pareto", "swe")


def heddle_configs() -> list[dict[str, Any]]:
    """Heddle's rows of the main tables (both scales and acceptances), of the sensitivity
    table, and on the untuned presets (both acceptances)."""
    rows: list[dict[str, Any]] = []
    for size in ({"prompts": 128, "gpus": 16}, {"prompts": None, "gpus": None}):
        for acceptance in ("default", "pessimistic"):
            for w, (cluster, *_rest) in WORKLOADS.items():
                rows.append({"workload": w, "cluster": cluster, **size, **HEDDLE,
                             "acceptance": acceptance})  # fmt: skip
    small = {"cluster": "cluster-tp4", "prompts": 128, "gpus": 16}
    for tau in SENSITIVITY:
        rows.append({"workload": "coding", **small, **HEDDLE, "acceptance": tau})
    for acceptance in ("default", "pessimistic"):
        for w in UNTUNED:
            rows.append({"workload": w, **small, **HEDDLE, "acceptance": acceptance})
    return rows


def findings_configs() -> list[dict[str, Any]]:
    """The findings table's Heddle rows (one mechanism at a time) that draft by the K
    table, both scales, default acceptance."""
    rows: list[dict[str, Any]] = []
    for size in ({"prompts": 128, "gpus": 16}, {"prompts": None, "gpus": None}):
        for w, (cluster, *_rest) in WORKLOADS.items():
            for name, knobs in ABLATIONS.items():
                if knobs.get("k_table", True):
                    rows.append({"workload": w, "cluster": cluster, **size, **HEDDLE,
                                 "acceptance": "default", "ablation": name, **knobs})  # fmt: skip
    return rows


def _spec(name: str) -> dict[str, Any]:
    """A workload preset: from specs.json, else its YAML (needs PyYAML)."""
    if name in SPECS:
        return dict(SPECS[name])
    import yaml  # noqa: PLC0415 - only for the presets specs.json does not hold

    path = HERE.parents[1] / "scheduler" / "presets" / f"{name}.yaml"
    return dict(yaml.safe_load(path.read_text()))


def _importable() -> None:
    """Where heddle is not installed: the pure scheduler package on its own (numpy only)."""
    try:
        import heddle.scheduler  # noqa: F401, PLC0415 - probing whether it is installed
    except ImportError:
        root = Path("/tmp/heddle-pure")
        pkg = root / "heddle"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text("")
        repo = HERE.parents[1]
        (pkg / "exceptions.py").write_text((repo / "heddle" / "exceptions.py").read_text())
        if not (pkg / "scheduler").exists():
            (pkg / "scheduler").symlink_to(repo / "scheduler")
        sys.path.insert(0, str(root))


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    _importable()
    from heddle.scheduler import (  # noqa: PLC0415 - after the path is set up
        HEDDLE_SPECULATION,
        ClusterSpec,
        PoolShape,
        SpeculationConfig,
        WorkloadSpec,
        acceptance_model,
        get_policy,
        synthetic_bench,
    )
    from heddle.scheduler.sim import (  # noqa: PLC0415
        SimConfig,
        SimSpeculation,
        Simulator,
        heddle_speculation,
    )

    started = time.perf_counter()
    spec = WorkloadSpec.from_dict(_spec(cfg["workload"]), f"preset {cfg['workload']!r}")
    if cfg["prompts"] is not None:
        spec = replace(spec, prompts=cfg["prompts"])
    bench = synthetic_bench(spec, 1)
    cluster = ClusterSpec.from_dict(SPECS[cfg["cluster"]], cfg["cluster"])
    if cfg["gpus"] is not None:
        cluster = replace(cluster, gpus=cfg["gpus"])
    method, _, k = cfg["spec"].partition(":")
    if cfg["spec"] == "suffix:auto":
        speculation = HEDDLE_SPECULATION
    else:
        speculation = SpeculationConfig(method, int(k) if k else None)
    model = acceptance_model(cfg["acceptance"])
    shape = None
    if cfg["policy"] != "heddle":
        tp = cluster.baseline_tp
        shape = PoolShape.of({tp: cluster.gpus // tp})
    sim_spec = None
    if speculation.enabled and cfg["policy"] == "heddle":
        # Heddle's drafting; a row may switch a mechanism off (the findings table).
        drafting = {
            key: cfg[key]
            for key in ("colocate_groups", "seed_siblings", "seed_history", "k_table", "k_measured")
            if key in cfg
        }
        sim_spec = heddle_speculation(speculation, model, **drafting)
    elif speculation.enabled:
        sim_spec = SimSpeculation(speculation, model)
    sim = Simulator(
        bench.scripts,
        cluster,
        get_policy(cfg["policy"]),
        tool_means_s=bench.tool_means_s,
        # The previous rollout seeds Heddle's predictor and is what its start-up decisions
        # simulate; a row with "history": False has none (the predictor's prior instead).
        history=bench.history if cfg.get("history", True) else (),
        shape=shape,
        config=SimConfig(max_trajectories_per_engine=cfg["cap"], speculation=sim_spec),
    )
    r = sim.run()
    return {
        **cfg,
        "trajectories": len(bench.scripts),
        "shape": r.shape,
        "scheduling": r.scheduling,
        "tokens_per_s": r.tokens_per_s,
        "makespan_s": r.makespan_s,
        "decisions_s": r.decisions_s,
        "speculation": r.speculation,
        "wall_s": time.perf_counter() - started,
    }


def main() -> None:
    out = Path(sys.argv[1])
    procs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    deadline = float(sys.argv[3]) if len(sys.argv) > 3 else 1e9
    scale = sys.argv[4] if len(sys.argv) > 4 else "both"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    todo = {
        "issue26": issue26_configs,
        "no-history": no_history_configs,
        "heddle": heddle_configs,
        "findings": findings_configs,
    }.get(scale, lambda: configs(scale))()
    with mp.Pool(procs) as pool, (out / "runs.jsonl").open("a") as f:
        pending = [pool.apply_async(run, (c,)) for c in todo]
        while pending and time.perf_counter() - t0 < deadline:
            for job in [j for j in pending if j.ready()]:
                pending.remove(job)
                try:
                    f.write(json.dumps(job.get()) + "\n")
                except Exception as exc:
                    f.write(json.dumps({"error": repr(exc)}) + "\n")
                f.flush()
            time.sleep(1)
        print(f"{len(pending)} runs unfinished after {time.perf_counter() - t0:.0f}s")
        pool.terminate()


if __name__ == "__main__":
    main()
