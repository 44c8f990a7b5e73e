"""Benchmarks of the rollout session on local workers.

``heddle bench engines``: policies A/B on the *same* running engines (vLLM's
CPU build on the tiny model by default, or the simulated engine), one
synthetic long-tailed workload with one seed, rounds interleaved so drift on
a noisy machine hits every policy alike. Reports median tokens/s and makespan
per policy and Heddle's ratio to each baseline.

``heddle bench control-loop``: one session process driving many concurrent
trajectories against simulated workers that take no time, to measure the
control loop itself: steps/s and session memory per trajectory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from heddle.api import (
    EnginePoolSpec,
    EnvironmentSpec,
    RolloutJobSpec,
    SamplingSpec,
    SyntheticSpec,
    TasksSpec,
)
from heddle.rollout import (
    LocalJob,
    LocalPool,
    LocalWorkerOptions,
    OutputSink,
    PoolPlan,
    SessionConfig,
    SessionMetrics,
    SessionResult,
    SyntheticEnvironment,
    Task,
    TaskSet,
    TrajectoryRun,
    build_session,
    local_speculation,
    perf_model_for,
    synthetic_tasks,
)
from heddle.scheduler import PerfModel, PoolShape, WorkloadSpec
from heddle.worker import Speculation, WorkerEndpoint

__all__ = [
    "bench_control_loop",
    "bench_engines",
    "parse_worker_speculation",
    "plot_engines",
    "run_session_bench",
]


def _pool_spec() -> EnginePoolSpec:
    from heddle.api import VLLMSpec  # noqa: PLC0415

    return EnginePoolSpec("bench", "default", "tiny", "", 2, 2, (1, 2), None, VLLMSpec())


def _pool_spec_perf(options: LocalWorkerOptions | None = None) -> Any:
    return perf_model_for(_pool_spec(), options)


async def _one_run(
    workers: Sequence[WorkerEndpoint],
    *,
    job: str,
    policy: str,
    tasks: list[Task],
    workload: WorkloadSpec,
    samples: int,
    seed: int,
    tool_time_scale: float,
    output: Path,
    max_total_tokens: int,
    config: SessionConfig,
    perf: PerfModel | None = None,
    max_in_flight: int | None = None,
    speculation: Speculation | None = None,
    trace: bool = False,
) -> tuple[SessionResult, list[float], dict[str, float]]:
    env = SyntheticEnvironment(
        workload, len(tasks), samples, seed=seed, tool_time_scale=tool_time_scale
    )
    # The job as a RolloutJob would give it, so the session is built by the one path
    # heddle run and session pods use (build_session).
    spec = RolloutJobSpec(
        name=job,
        namespace="default",
        engine_pool="bench",
        tasks=TasksSpec(),
        samples_per_task=samples,
        sampling=SamplingSpec(
            max_tokens_per_turn=max_total_tokens, max_total_tokens=max_total_tokens
        ),
        environment=EnvironmentSpec(
            "synthetic", synthetic=SyntheticSpec(workload.name, seed, tool_time_scale)
        ),
        max_turns=workload.max_turns,
        policy=policy,
        replan_interval_s=config.replan_interval_s,
        output_path=str(output),
        deadline_s=None,
        output_trace=trace,  # the token trace beside the output (the fidelity bench's replay)
    )
    local = LocalJob(spec, _pool_spec(), TaskSet(tasks, []), workload, output, output.parent)
    session = build_session(
        local,
        workers,
        OutputSink(output, fsync_interval_s=5.0),
        plan=PoolPlan(PoolShape.of([w.tp for w in workers]), policy, max_in_flight),
        perf=perf if perf is not None else _pool_spec_perf(),
        environment=env,
        config=config,
        metrics=SessionMetrics(),
        # What the workers run: with suffix or auto the session feeds their drafting
        # corpus and takes the co-location decision, as heddle run does on such a pool.
        speculation=speculation,
    )
    started = time.time()
    result = await session.run()
    finishes = []
    for run in session.runs.values():
        finishes.append(run.finished_at - started if run.finished_at else float("nan"))
    per_run = {**_longest(session.runs.values()), **_speculated(session.runs.values())}
    if per_run.get("longest_generated_tokens"):
        # From the rollout's start: under an in-flight cap the wall time above starts
        # only when the trajectory got a slot, so it hides the wait for one.
        longest = max(
            (r for r in session.runs.values() if r.finished_at),
            key=lambda r: r.traj.generated_tokens,
        )
        per_run["longest_finish_s"] = longest.finished_at - started
    return result, sorted(finishes), per_run


def _longest(runs: Iterable[TrajectoryRun]) -> dict[str, float]:
    """The trajectory that generated the most tokens, to set against the makespan: its
    wall time from start to finish, the part of it its steps waited in an engine's
    queue, and the rest (its own serial time on these engines: prefill, decode at the
    batch it ran in, tools, requests), the bound a rollout hits when one trajectory
    sets the makespan."""
    done = [r for r in runs if r.finished_at]
    if not done:
        return {}
    run = max(done, key=lambda r: r.traj.generated_tokens)
    wall = run.finished_at - run.started_at
    return {
        "longest_generated_tokens": float(run.traj.generated_tokens),
        "longest_turns": float(run.traj.turns),
        "longest_wall_s": wall,
        "longest_queue_s": run.queue_s,
        "longest_tool_s": float(sum(run.tool_latency_s)),
        "longest_serial_s": wall - run.queue_s,
    }


def parse_worker_speculation(text: str) -> Speculation:
    """``heddle bench engines --speculation``: the workers' stock vLLM speculation, one
    setting for every policy: ``off``, ``METHOD`` (K 4), ``METHOD:K``, or ``METHOD:TABLE``
    with K by batch size (``suffix:1-8:4,9-32:2,33-256:0``)."""
    from heddle.exceptions import ConfigError  # noqa: PLC0415
    from heddle.worker import Speculation, parse_batch_size_table  # noqa: PLC0415

    method, _, rest = text.strip().partition(":")
    if not rest:
        return Speculation.of(method)
    if rest.isdigit():
        return Speculation.of(method, int(rest))
    if "-" in rest:
        return Speculation.of(method, None, parse_batch_size_table(rest, "--speculation"))
    raise ConfigError(
        f"--speculation {text!r}: for 'engines' write off, METHOD, METHOD:K or METHOD:TABLE, "
        "e.g. suffix:4 or suffix:1-8:4,9-32:2,33-256:0"
    )


def _speculated(runs: Iterable[TrajectoryRun]) -> dict[str, float]:
    """Drafted and accepted tokens over the run, and tokens per decode step (engines that
    speculate only; empty otherwise)."""
    counts = [r.speculation for r in runs if r.speculation is not None]
    if not counts:
        return {}
    drafted = sum(c["drafted_tokens"] for c in counts)
    accepted = sum(c["accepted_tokens"] for c in counts)
    tokens = sum(c["tokens"] for c in counts)
    steps = sum(c["decode_steps"] for c in counts)
    return {
        "drafted_tokens": float(drafted),
        "accepted_tokens": float(accepted),
        "tokens_per_decode_step": tokens / steps if steps else float("nan"),
    }


def parse_policy_cap(name: str) -> tuple[str, int | None]:
    """``verl@16``: the policy ``verl`` with at most 16 trajectories in flight per engine
    (the rest start in task order as others finish); a bare name has no cap."""
    from heddle.exceptions import ConfigError  # noqa: PLC0415

    policy, sep, cap = name.partition("@")
    if not sep:
        return name, None
    if not cap.isdigit() or int(cap) < 1:
        raise ConfigError(f"policy {name!r}: write NAME@N with N a positive whole number")
    return policy, int(cap)


def bench_engines(
    *,
    workload: WorkloadSpec,
    policies: Sequence[str],
    options: LocalWorkerOptions,
    tps: list[int],
    samples: int,
    rounds: int,
    seed: int,
    tool_time_scale: float,
    out: Path,
    progress: Callable[[str], None] = print,
    perf: PerfModel | None = None,
    trace: bool = False,
) -> dict[str, Any]:
    """A/B of ``policies`` on one set of local workers; see the module docstring.

    ``trace``: every run, the warm-up too, also writes its token trace
    (``runs/NAME.trace.jsonl``).

    ``perf`` is the planners' performance model (default: what ``heddle run``
    plans with on these workers: the shipped CPU profile for vLLM on the tiny
    model, else Qwen3-8B on H100).
    """
    if perf is None:
        perf = _pool_spec_perf(options)
    for policy in policies:
        parse_policy_cap(policy)  # a bad NAME@N fails before the workers start
    tasks = synthetic_tasks(workload.prompts, workload, seed)
    speculation = local_speculation(options)  # as the workers run it: auto off on CPU
    pool = LocalPool(tps, options)
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    cdfs: dict[str, list[float]] = {}

    async def go() -> None:
        workers = await pool.start()
        # One unrecorded run first, of the very workload and seed the rounds run. It warms
        # the engines (the first batch shapes on the CPU build cost SmolLM2 20-35 s), and
        # it leaves in vLLM's prefix cache what every later run finds there: the previous
        # run's texts, token for token the same (the steps are seeded), so every prompt,
        # and every turn's context, is cached. A warm-up on other tasks left the first
        # measured run alone to prefill its prompts cold: on SmolLM2, 384 more prompt
        # tokens per engine than any later run (docs/speculation.md, the A/B).
        base, cap = parse_policy_cap(policies[0])
        await _one_run(
            workers,
            job="warmup",
            policy=base,
            max_in_flight=cap * len(workers) if cap else None,
            tasks=tasks,
            workload=workload,
            samples=samples,
            seed=seed,
            tool_time_scale=tool_time_scale,
            output=out / "runs" / "warmup.jsonl",
            max_total_tokens=workload.max_output_tokens,
            config=SessionConfig(replan_interval_s=1.0),
            perf=perf,
            speculation=speculation,
            trace=trace,
        )
        progress(f"warm-up: the workload once under {policies[0]}, unrecorded")
        for r in range(rounds):
            order = list(policies[r % len(policies) :]) + list(policies[: r % len(policies)])
            for policy in order:
                base, cap = parse_policy_cap(policy)
                label = policy.replace("@", "-cap")
                output = out / "runs" / f"{label}-r{r}.jsonl"
                output.unlink(missing_ok=True)
                cpu = time.process_time()
                result, finishes, longest = await _one_run(
                    workers,
                    job=f"{label}-r{r}",
                    policy=base,
                    max_in_flight=cap * len(workers) if cap else None,
                    tasks=tasks,
                    workload=workload,
                    samples=samples,
                    seed=seed,
                    tool_time_scale=tool_time_scale,
                    output=output,
                    max_total_tokens=workload.max_output_tokens,
                    config=SessionConfig(replan_interval_s=1.0),
                    perf=perf,
                    speculation=speculation,
                    trace=trace,
                )
                p = result.progress
                # The session's CPU and the machine's load: on a CPU testbed the session
                # competes with the workers for the cores, and so do other processes.
                row = {
                    "session_cpu_s": time.process_time() - cpu,
                    "load_average_1m": os.getloadavg()[0],
                    "round": r,
                    "makespan_s": p.elapsed_s,
                    "tokens": p.tokens,
                    "tokens_per_s": p.tokens / p.elapsed_s,
                    "steps": result.steps,
                    "migrations": result.migrations,
                    "recomputes": result.recomputes,
                    "done": p.done,
                    "failed": p.failed,
                    **longest,
                }
                runs[policy].append(row)
                cdfs[policy] = finishes
                progress(
                    f"round {r + 1}/{rounds} {policy:>10s}: {p.elapsed_s:7.1f} s makespan, "
                    f"{row['tokens_per_s']:8.0f} tok/s, {result.migrations} migrations, "
                    f"longest trajectory ({longest.get('longest_generated_tokens', 0.0):.0f} "
                    f"tokens) {longest.get('longest_wall_s', 0.0):.1f} s, "
                    f"{longest.get('longest_serial_s', 0.0):.1f} s of it not queued, "
                    f"done {longest.get('longest_finish_s', 0.0):.1f} s into the run"
                )

    try:
        asyncio.run(go())
    finally:
        asyncio.run(pool.stop())
    summary = {
        p: {
            "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
            "median_makespan_s": statistics.median(r["makespan_s"] for r in rows),
            "min_tokens_per_s": min(r["tokens_per_s"] for r in rows),
            "max_tokens_per_s": max(r["tokens_per_s"] for r in rows),
            # The tail: the longest trajectory's wall time and the part it queued.
            "median_longest_wall_s": statistics.median(r.get("longest_wall_s", 0.0) for r in rows),
            "median_longest_queue_s": statistics.median(
                r.get("longest_queue_s", 0.0) for r in rows
            ),
            "median_longest_finish_s": statistics.median(
                r.get("longest_finish_s", 0.0) for r in rows
            ),
            "tokens": rows[0]["tokens"],
        }
        for p, rows in runs.items()
    }
    ratios = {}
    if "heddle" in summary:
        for p in policies:
            if p != "heddle":
                ratios[f"heddle/{p}"] = (
                    summary["heddle"]["median_tokens_per_s"] / summary[p]["median_tokens_per_s"]
                )
    return {
        "engine": options.engine,
        "model": options.model,
        "speculation": {
            "method": options.speculation.method,
            "num_speculative_tokens": options.speculation.num_speculative_tokens,
            "by_batch_size": [list(e) for e in options.speculation.by_batch_size],
            "workers_method": speculation.method,  # auto resolved where it is off
        },
        "max_num_seqs": options.max_num_seqs,
        "shape": tps,
        "workload": workload.name,
        "trajectories": len(tasks) * samples,
        "rounds": rounds,
        "seed": seed,
        "policies": summary,
        "throughput_ratios": ratios,
        "runs": runs,
        "finish_times_last_round": cdfs,
    }


def plot_engines(result: dict[str, Any], png: Path) -> Path:
    import matplotlib  # noqa: PLC0415 - the plot extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(result["policies"])
    left.bar(names, [result["policies"][n]["median_tokens_per_s"] for n in names])
    left.set(ylabel="tokens/s (median over rounds)")
    left.set_title(f"{result['engine']} workers {result['shape']}, {result['trajectories']} traj.")
    for name, finishes in result["finish_times_last_round"].items():
        right.step(finishes, range(1, len(finishes) + 1), where="post", label=name)
    right.set(xlabel="seconds", ylabel="trajectories finished")
    right.set_title("completion, last round")
    right.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def bench_control_loop(
    *,
    workload: WorkloadSpec,
    trajectories: int,
    workers: int,
    tool_time_scale: float,
    out: Path,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Steps/s and memory of one session driving ``trajectories`` at once on instant sim workers."""
    samples = workload.samples_per_prompt
    spec = dataclasses.replace(workload, prompts=max(1, trajectories // samples))
    tasks = synthetic_tasks(spec.prompts, spec, 0)
    options = LocalWorkerOptions(
        engine="sim", time_scale=0.0, max_model_len=1 << 20, log_dir=out / "logs"
    )
    pool = LocalPool([1] * workers, options)
    measured: dict[str, Any] = {}

    async def go() -> None:
        endpoints = await pool.start()
        before = _rss_mib()
        output = out / "control-loop.jsonl"
        output.unlink(missing_ok=True)
        peak = [before]

        async def sample_rss() -> None:
            while True:
                peak.append(_rss_mib())
                await asyncio.sleep(0.5)

        sampler = asyncio.create_task(sample_rss())
        started, cpu_started = time.perf_counter(), time.process_time()
        result, _, _ = await _one_run(
            endpoints,
            job="scale",
            policy="heddle",
            tasks=tasks,
            workload=spec,
            samples=samples,
            seed=0,
            tool_time_scale=tool_time_scale,
            output=output,
            max_total_tokens=spec.max_output_tokens,
            config=SessionConfig(replan_interval_s=2.0, progress_interval_s=5.0),
        )
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        sampler.cancel()
        n = result.progress.total
        measured.update(
            trajectories=n,
            steps=result.steps,
            elapsed_s=elapsed,
            steps_per_s=result.steps / elapsed,
            session_cpu_s=cpu,
            session_cpu_ms_per_step=1000 * cpu / max(1, result.steps),
            control_loop_steps_per_cpu_s=result.steps / cpu if cpu > 0 else 0.0,
            tokens=result.progress.tokens,
            rss_before_mib=before,
            rss_peak_mib=max(peak),
            kib_per_trajectory=(max(peak) - before) * 1024 / max(1, n),
            done=result.progress.done,
            recomputes=result.recomputes,
            migrations=result.migrations,
        )
        progress(
            f"{n} trajectories, {result.steps} steps in {elapsed:.1f} s: "
            f"{measured['steps_per_s']:.0f} steps/s; session CPU "
            f"{measured['session_cpu_ms_per_step']:.2f} ms per step, "
            f"{measured['kib_per_trajectory']:.1f} KiB per trajectory (peak RSS growth)"
        )

    try:
        asyncio.run(go())
    finally:
        asyncio.run(pool.stop())
    return {"workload": workload.name, "workers": workers, **measured}


def run_session_bench(args: Any, out: Path) -> dict[str, Any]:
    """``heddle bench engines|control-loop`` (the CLI's arguments)."""
    from heddle.rollout import (  # noqa: PLC0415
        load_workload,
        local_model_dir,
    )

    workload = load_workload(args.workload or "quickstart")
    out.mkdir(parents=True, exist_ok=True)
    if args.target == "control-loop":
        return bench_control_loop(
            workload=workload,
            trajectories=args.trajectories or 10_000,
            workers=args.workers,
            tool_time_scale=args.tool_time_scale,
            out=out,
        )
    if args.prompts:
        workload = dataclasses.replace(workload, prompts=args.prompts)
    model = local_model_dir(args.model or "tiny", None) if args.engine == "vllm" else None
    speculation = parse_worker_speculation(args.speculation or "off")
    if speculation.on and args.engine != "vllm":
        from heddle.exceptions import ConfigError  # noqa: PLC0415

        raise ConfigError(
            f"--speculation {args.speculation} needs --engine vllm: the sim engine does not draft"
        )
    options = LocalWorkerOptions(
        speculation=speculation,
        engine=args.engine,
        model=model,
        max_model_len=4096 if args.engine == "vllm" else 1 << 20,
        max_num_seqs=args.max_num_seqs,
        time_scale=1.0,
        # Simulated workers run the cluster's performance model: --cluster 2xcpu-tiny
        # plays the vLLM CPU workers (their profile and batch cap of 8).
        cluster=args.cluster if args.engine == "sim" else None,
        log_dir=out / "logs",
    )
    policies = [p for p in args.policies.split(",") if p] if args.policies else []
    result = bench_engines(
        workload=workload,
        policies=policies or ["heddle", "verl", "slime"],
        options=options,
        tps=[args.tp] * max(1, 2 // args.tp),
        samples=workload.samples_per_prompt,
        rounds=args.rounds,
        seed=args.seed,
        tool_time_scale=args.tool_time_scale,
        out=out,
    )
    for key, ratio in result["throughput_ratios"].items():
        print(f"{key}: {ratio:.2f}x tokens/s")
    try:
        print(f"wrote {plot_engines(result, out / 'engines.png')}")
    except ImportError:
        print("no plot: matplotlib is not installed (pip install 'heddle[plot]')")
    return result
