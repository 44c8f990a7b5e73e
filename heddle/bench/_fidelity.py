"""``heddle bench fidelity``: one workload on real workers and in the simulator, per policy.

(a) Real: ``heddle bench engines``' machinery, two local ``heddle worker
--engine vllm`` processes (TP1 each, the tiny model), the policies in
interleaved rounds; the median makespan per policy. (b) Simulated: the same
trajectory scripts (same workload, same seed) on two simulated TP1 engines
whose times come from an engine profile of this machine
(:class:`heddle.scheduler.ProfiledPerfModel`), with the workers' batch cap
and KV capacity. Both sides plan with that profiled model.

One thing the scripts do not say is fixed before simulating: how many tokens
the model sees. A prompt of ``n`` words becomes ``n`` tokens *plus the chat
template's*, and so does each tool reply; the simulator is run both on the
scripts as written and on the scripts with the token counts the real run's
records carry (``as tokenized``), and the error is taken on the latter.

With ``speculation`` the workers run that stock vLLM speculation (the real
model: drafts on the tiny model's random text mean nothing), every run writes
its token trace, and the simulator runs the same method and K table with each
trajectory's tokens per decode step *replayed*: vLLM's drafter run over the
tokens the real run generated, on the engine and beside the requests it really
ran with (heddle/bench/_spec_replay.py). The acceptance is thus predicted from
the text, not copied from the workers' counts, which are reported beside it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from heddle.exceptions import ConfigError
from heddle.rollout import LocalWorkerOptions, SyntheticEnvironment
from heddle.scheduler import (
    ClusterSpec,
    EngineProfile,
    PoolShape,
    SpeculationConfig,
    TrajectoryScript,
    WorkloadSpec,
    acceptance_model,
    get_policy,
    load_profile,
)
from heddle.scheduler.sim import SimConfig, SimSpeculation, Simulator, heddle_speculation
from heddle.worker import AUTO_ACCEPTANCE, Speculation

from ._session import bench_engines, parse_worker_speculation
from ._spec_replay import StepTokens, k_for_batch, replay_engines, requests_of
from ._spec_replay import measured as measured_counts

__all__ = [
    "bench_fidelity",
    "fidelity_cluster",
    "fidelity_speculation",
    "format_fidelity",
    "outside_engine_per_step",
    "pairs_agree",
    "parse_fidelity_speculation",
    "replayed_acceptance",
    "run_fidelity",
    "simulate",
    "tokenized_scripts",
]

TARGET_ERROR = 0.15  # the bar: within 15% of the real makespan


def fidelity_cluster(profile: EngineProfile, workers: int, batch_cap: int) -> ClusterSpec:
    """``workers`` TP1 engines timed by ``profile``, with the real workers' batch cap."""
    return ClusterSpec(
        f"{workers}x{profile.name}", workers, workers, profile.model.name, "profiled",
        (1,), 1, batch_cap, profile=profile,
    )  # fmt: skip


def parse_fidelity_speculation(text: str | None, model: str | None) -> Speculation:
    """``--speculation`` as ``bench engines`` takes it, for the stock methods a replay
    can follow (not ``auto``, whose K table the worker picks), and only on a real model."""
    speculation = parse_worker_speculation(text or "off")
    if speculation.method == "auto":
        raise ConfigError(
            f"--speculation {text}: fidelity replays a known K, and auto's table is the "
            "worker's choice; give METHOD:K or METHOD:TABLE, e.g. suffix:4"
        )
    if speculation.on and (model or "tiny") == "tiny":
        raise ConfigError(
            f"--speculation {text} needs a real model: the tiny model's random weights "
            "write text no drafter predicts; add --model smollm2"
        )
    return speculation


def fidelity_speculation(
    speculation: Speculation, policy: str, replayed: Mapping[str, float]
) -> SimSpeculation:
    """The workers' speculation as the simulator runs it for ``policy``: the same method
    and K (or K table), each trajectory at its ``replayed`` tokens per step; Heddle's
    runs also take the co-location decision and seed siblings and history as the live
    session does (rollout/_colocation.py), the baselines run stock vLLM."""
    table = tuple((last, k) for _, last, k in speculation.by_batch_size)
    config = SpeculationConfig(
        speculation.method, None if table else speculation.num_speculative_tokens
    )
    acceptance = acceptance_model(AUTO_ACCEPTANCE)  # what the live session decides with
    if get_policy(policy).name.startswith("heddle") and speculation.method == "suffix":
        base = heddle_speculation(config, acceptance, k_table=False)
    else:
        base = SimSpeculation(config, acceptance)
    return dataclasses.replace(base, k_by_batch_size=table, replayed=dict(replayed))


def simulate(
    scripts: Sequence[TrajectoryScript],
    cluster: ClusterSpec,
    policies: Sequence[str],
    tool_means_s: Mapping[str, float],
    speculation: Callable[[str], SimSpeculation | None] | None = None,
    tokens_per_step: dict[str, float] | None = None,
) -> dict[str, float]:
    """Makespan per policy on ``cluster`` (the real session's replan interval, no history).

    ``speculation`` gives each policy's (None: plain decode); the simulator's own
    tokens per decode step go to ``tokens_per_step`` where given.
    """
    shape = PoolShape.of({1: cluster.gpus})
    out: dict[str, float] = {}
    for name in policies:
        spec = speculation(name) if speculation is not None else None
        sim = Simulator(
            scripts, cluster, get_policy(name), tool_means_s=tool_means_s,
            config=SimConfig(replan_interval_s=1.0, speculation=spec), shape=shape,
        )  # fmt: skip
        result = sim.run()
        out[name] = result.makespan_s
        if tokens_per_step is not None:
            tokens_per_step[name] = float(result.speculation.get("tokens_per_step", 1.0))
    return out


def replayed_acceptance(
    out: Path,
    policies: Sequence[str],
    rounds: int,
    scripts: Sequence[TrajectoryScript],
    samples: int,
    speculation: Speculation,
) -> dict[str, dict[str, Any]]:
    """Per policy: each trajectory's replayed tokens per step (by script id, over the
    rounds) and the policy's replayed and measured figures (module docstring)."""

    def key(line: Mapping[str, Any]) -> str:
        return str(scripts[int(line["task_index"]) * samples + int(line["sample"])].id)

    names = ["warmup"] + [f"{p}-r{r}" for r in range(rounds) for p in policies]
    requests = [
        req
        for name in names
        if (trace := out / "runs" / f"{name}.trace.jsonl").is_file()
        for req in requests_of(name, _read_records(trace), key=key)
    ]
    choose = k_for_batch(speculation.num_speculative_tokens, speculation.by_batch_size)
    replay = replay_engines(requests, speculation.method, choose)
    result: dict[str, dict[str, Any]] = {}
    for p in policies:
        per_traj: dict[str, StepTokens] = {}
        real_total, replay_total = StepTokens(), StepTokens()
        errors: list[float] = []
        for r in range(rounds):
            got = replay.get(f"{p}-r{r}", {})
            real = measured_counts(_read_records(out / "runs" / f"{p}-r{r}.jsonl"), key=key)
            for tid, t in got.items():
                per_traj.setdefault(tid, StepTokens()).add(t)
                replay_total.add(t)
                if tid in real and real[tid].tokens:
                    errors.append(t.tokens_per_step / real[tid].tokens_per_step - 1.0)
            for m in real.values():
                real_total.add(m)
        result[p] = {
            "replayed": {tid: t.decode_tokens_per_step for tid, t in per_traj.items()},
            "real_tokens_per_step": real_total.tokens_per_step,
            "replay_tokens_per_step": replay_total.tokens_per_step,
            # Per trajectory and round, replayed against measured: how well the
            # replay predicts each trajectory, not only the policy's mean.
            "replay_error_median_abs": statistics.median(abs(e) for e in errors)
            if errors else float("nan"),
            "trajectories_compared": len(errors),
        }  # fmt: skip
    return result


def tokenized_scripts(
    scripts: Sequence[TrajectoryScript], records: Sequence[Mapping[str, Any]], samples: int
) -> tuple[list[TrajectoryScript], dict[str, float]]:
    """The scripts with the prompt and tool-reply token counts the engine really got.

    Returns them and how much longer the real ones were on average (tokens).
    """
    by_index = {int(r["task_index"]) * samples + int(r["sample"]): r for r in records}
    fixed: list[TrajectoryScript] = []
    prompt_extra: list[int] = []
    tool_extra: list[int] = []
    for i, script in enumerate(scripts):
        rec = by_index.get(i)
        tools = list(rec["trace"]["tool_output_tokens"]) if rec else []
        if rec is None or len(tools) != len(script.tool_output_tokens):
            fixed.append(script)  # a failed or truncated run: keep what was written
            continue
        prompt = int(rec["tokens"]["prompt"])
        prompt_extra.append(prompt - script.prompt_tokens)
        tool_extra += [a - b for a, b in zip(tools, script.tool_output_tokens, strict=True)]
        fixed.append(
            dataclasses.replace(script, prompt_tokens=prompt, tool_output_tokens=tuple(tools))
        )
    return fixed, {
        "prompt_extra_tokens": statistics.fmean(prompt_extra) if prompt_extra else 0.0,
        "tool_reply_extra_tokens": statistics.fmean(tool_extra) if tool_extra else 0.0,
        "trajectories_matched": float(len(prompt_extra)),
    }


def _ranking(makespans: Mapping[str, float]) -> list[str]:
    return sorted(makespans, key=lambda p: makespans[p])


def pairs_agree(rows: Mapping[str, Mapping[str, float]]) -> tuple[int, int]:
    """(pairs the real run separates, those the simulator orders the same way).

    The real run separates two policies when their makespans over the rounds
    (min to max) do not overlap; closer than that, their order is noise.
    """
    names = list(rows)
    separated = agreeing = 0
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ra, rb = rows[a], rows[b]
            if ra["real_max_makespan_s"] < rb["real_min_makespan_s"]:
                separated += 1
                agreeing += ra["sim_makespan_s"] < rb["sim_makespan_s"]
            elif rb["real_max_makespan_s"] < ra["real_min_makespan_s"]:
                separated += 1
                agreeing += rb["sim_makespan_s"] < ra["sim_makespan_s"]
    return separated, agreeing


def outside_engine_per_step(records: Sequence[Mapping[str, Any]], mean: bool = False) -> float:
    """Over trajectories, the time per step spent neither in the engine core nor in the
    tool: HTTP, the session's loop, the worker's handling, vLLM's API process. The median,
    or with ``mean`` the mean weighted by steps (what a makespan adds up).

    The simulator knows only the profile's ``request_overhead_s`` for it. Records
    written before ``engine_s`` existed fall back to the worker's whole engine call.
    """
    rows: list[tuple[float, int]] = [
        (
            float(t["duration_s"] - t["tool_s"] - t.get("engine_s", t["generate_s"])),
            int(r["turns"]),
        )
        for r in records
        if r.get("turns") and (t := r["timings"])
    ]
    if not rows:
        return 0.0
    if mean:
        return sum(s for s, _ in rows) / sum(n for _, n in rows)
    return statistics.median(s / n for s, n in rows)


def _read_records(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def bench_fidelity(
    *,
    workload: WorkloadSpec,
    profile: EngineProfile,
    policies: Sequence[str],
    options: LocalWorkerOptions,
    workers: int,
    rounds: int,
    seed: int,
    out: Path,
    progress: Callable[[str], None] = print,
    reprofile: Callable[[], EngineProfile] | None = None,
) -> dict[str, Any]:
    """Real and simulated makespan per policy; see the module docstring (the workers'
    speculation is ``options.speculation``).

    ``reprofile`` measures the engine again after the rounds; the simulator
    then also runs on that profile, which brackets how far the machine's
    speed drifted while the rounds ran.
    """
    if 1 not in profile.tps:
        raise ConfigError(f"profile {profile.name!r} has no TP1 measurements; profile at TP1")
    cluster = fidelity_cluster(profile, workers, options.max_num_seqs)
    perf = cluster.perf_model()
    real = bench_engines(
        workload=workload, policies=policies, options=options, tps=[1] * workers,
        samples=workload.samples_per_prompt, rounds=rounds, seed=seed, tool_time_scale=1.0,
        out=out, progress=progress, perf=perf, trace=options.speculation.on,
    )  # fmt: skip
    env = SyntheticEnvironment(workload, workload.prompts, workload.samples_per_prompt, seed=seed)
    scripts = list(env.scripts)
    means = {t.name: t.latency_s.median for t in workload.tools}
    spec = options.speculation
    accept: dict[str, dict[str, Any]] = {}
    spec_of: Callable[[str], SimSpeculation | None] | None = None
    if spec.on:
        samples = workload.samples_per_prompt
        accept = replayed_acceptance(out, policies, rounds, scripts, samples, spec)

        def spec_of(p: str) -> SimSpeculation | None:
            return fidelity_speculation(spec, p, accept[p]["replayed"])

    scripted = simulate(scripts, cluster, policies, means, spec_of)
    records = _read_records(out / "runs" / f"{policies[0]}-r0.jsonl")
    as_tokenized, extra = tokenized_scripts(scripts, records, workload.samples_per_prompt)
    sim_tps: dict[str, float] = {}
    simulated = simulate(as_tokenized, cluster, policies, means, spec_of, sim_tps)
    after: dict[str, float] = {}
    if reprofile is not None:
        later = reprofile()
        after = simulate(as_tokenized, fidelity_cluster(later, workers, options.max_num_seqs),
                         policies, means, spec_of)  # fmt: skip
    rows: dict[str, dict[str, float]] = {}
    for p in policies:
        measured = real["policies"][p]["median_makespan_s"]
        spread = [r["makespan_s"] for r in real["runs"][p]]
        rows[p] = {
            "real_median_makespan_s": measured,
            "real_min_makespan_s": min(spread),
            "real_max_makespan_s": max(spread),
            "sim_makespan_s": simulated[p],
            "sim_scripted_makespan_s": scripted[p],
            "error": simulated[p] / measured - 1.0,
        }
        if after:
            rows[p]["sim_after_makespan_s"] = after[p]
            rows[p]["error_after"] = after[p] / measured - 1.0
        if p in accept:
            a = accept[p]
            rows[p]["real_tokens_per_step"] = a["real_tokens_per_step"]
            rows[p]["replay_tokens_per_step"] = a["replay_tokens_per_step"]
            rows[p]["sim_tokens_per_step"] = sim_tps[p]
            rows[p]["replay_error_median_abs"] = a["replay_error_median_abs"]
            rows[p]["trajectories_compared"] = a["trajectories_compared"]
    real_rank = _ranking({p: r["real_median_makespan_s"] for p, r in rows.items()})
    sim_rank = _ranking(simulated)
    # One round has no spread to tell a difference from noise: no pair counts as separated.
    separated, agreeing = pairs_agree(rows) if rounds > 1 else (0, 0)
    every_run = [r for runs in real["runs"].values() for r in runs]
    every_records = [
        _read_records(out / "runs" / f"{p}-r{r}.jsonl") for p in policies for r in range(rounds)
    ]
    outside = statistics.median(outside_engine_per_step(rs) for rs in every_records)
    outside_mean = statistics.median(outside_engine_per_step(rs, mean=True) for rs in every_records)
    cores = os.cpu_count() or 1
    return {
        "workload": workload.name,
        "trajectories": len(scripts),
        # Not in the simulator: the session's CPU on the workers' cores, and others' load.
        "session_cpu_share": statistics.median(
            r["session_cpu_s"] / (r["makespan_s"] * cores) for r in every_run
        ),
        "load_average_1m": [
            min(r["load_average_1m"] for r in every_run),
            max(r["load_average_1m"] for r in every_run),
        ],
        "workers": workers,
        "model": options.model,
        "speculation": {
            "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens if spec.on else None,
            "by_batch_size": [list(e) for e in spec.by_batch_size],
            # Where the simulator's acceptance comes from (module docstring).
            "acceptance": "replayed from the real run's tokens" if spec.on else None,
        },
        "max_num_seqs": options.max_num_seqs,
        "kv_capacity_tokens": perf.kv_capacity_tokens(1),
        "profile": profile.name,
        "profile_source": profile.source,
        "rounds": rounds,
        "seed": seed,
        "policies": rows,
        "real_ranking": real_rank,
        "sim_ranking": sim_rank,
        "ranking_agrees": real_rank == sim_rank,
        "pairs_separated_by_real_run": separated,
        "pairs_simulator_orders_alike": agreeing,
        "within_target": all(abs(r["error"]) <= TARGET_ERROR for r in rows.values()),
        "tokenization": extra,
        "request_overhead_s": profile.request_overhead_s,
        "real_outside_engine_per_step_s": outside,
        "real_outside_engine_mean_per_step_s": outside_mean,
        "real": real,
    }


def format_fidelity(result: Mapping[str, Any]) -> str:
    lines = [
        f"{result['workload']}: {result['trajectories']} trajectories on {result['workers']} "
        f"TP1 workers (batch cap {result['max_num_seqs']}), {result['rounds']} rounds; "
        f"simulator on profile {result['profile']}",
        f"{'policy':>10s} {'real (median, min-max)':>24s} {'simulated':>10s} {'error':>7s}"
        f" {'sim, scripted tokens':>21s}",
    ]
    for p, r in result["policies"].items():
        spread = f"{r['real_median_makespan_s']:.1f} s ({r['real_min_makespan_s']:.1f}-" + (
            f"{r['real_max_makespan_s']:.1f})"
        )
        line = (
            f"{p:>10s} {spread:>24s} {r['sim_makespan_s']:8.1f} s {r['error']:+7.1%}"
            f" {r['sim_scripted_makespan_s']:19.1f} s"
        )
        if "error_after" in r:
            line += (
                f"   on the profile taken after: {r['sim_after_makespan_s']:.1f} s "
                f"{r['error_after']:+.1%}"
            )
        lines.append(line)
    spec = result.get("speculation") or {}
    if spec.get("acceptance"):
        table = ",".join(f"{a}-{b}:{k}" for a, b, k in spec["by_batch_size"])
        lines.append(
            f"speculation: {spec['method']} K {table or spec['num_speculative_tokens']} on "
            f"{result['model']}; the simulator's acceptance {spec['acceptance']}"
        )
        lines.append(
            f"{'policy':>10s} {'tokens per decode step: real':>29s} {'replayed':>9s}"
            f" {'simulated':>10s} {'per-trajectory replay error (median |x|)':>41s}"
        )
        for p, r in result["policies"].items():
            lines.append(
                f"{p:>10s} {r['real_tokens_per_step']:29.3f} {r['replay_tokens_per_step']:9.3f}"
                f" {r['sim_tokens_per_step']:10.3f} {r['replay_error_median_abs']:34.1%}"
                f" (of {r['trajectories_compared']})"
            )
    agree = "agrees" if result["ranking_agrees"] else "DISAGREES"
    lines.append(
        f"ranking (fastest first): real {' < '.join(result['real_ranking'])}; simulated "
        f"{' < '.join(result['sim_ranking'])}: {agree}; within {TARGET_ERROR:.0%}: "
        f"{'yes' if result['within_target'] else 'no'}"
    )
    low, high = result["load_average_1m"]
    lines.append(
        f"the session process used {result['session_cpu_share']:.0%} of the machine's CPU "
        f"(median over runs; not simulated); load average {low:.1f}-{high:.1f} "
        f"on {os.cpu_count()} cores"
    )
    outside, overhead = result["real_outside_engine_per_step_s"], result["request_overhead_s"]
    outside_mean = result.get("real_outside_engine_mean_per_step_s", outside)
    lines.append(
        f"time per step outside the engine core and the tool: real {outside_mean:.3f} s "
        f"(mean; median {outside:.3f} s), simulated {overhead:.3f} s (the profile's "
        "request overhead)"
    )
    lines.append(
        f"pairs of policies the real run separates (makespan ranges over rounds apart): "
        f"{result['pairs_separated_by_real_run']}, ordered alike by the simulator: "
        f"{result['pairs_simulator_orders_alike']}"
    )
    return "\n".join(lines)


_WORKERS = 2  # local vLLM workers at TP1, one per core of the 2-core hosts this runs on


def run_fidelity(args: Any, out: Path) -> dict[str, Any]:
    """``heddle bench profile|fidelity`` (the CLI's arguments)."""
    from heddle.rollout import (  # noqa: PLC0415
        load_workload,
        local_model_dir,
    )

    from ._profile import bench_profile, profile_grid, rollout_per_worker  # noqa: PLC0415

    grid = profile_grid(args.max_num_seqs, args.profile_contexts, args.profile_prefills)
    out.mkdir(parents=True, exist_ok=True)
    engine = args.engine
    speculation = Speculation()
    if args.target == "fidelity":  # bad input fails before any worker starts
        speculation = parse_fidelity_speculation(args.speculation, args.model)
        if speculation.on and engine != "vllm":
            raise ConfigError(
                f"--speculation {args.speculation} needs --engine vllm: the sim engine "
                "does not draft"
            )
    name = f"vllm-cpu-{Path(args.model or 'tiny').name.lower()}"
    measured = str((out / f"profile-{name}.json").resolve())
    workload = load_workload(args.workload or "fidelity")
    if args.prompts:
        workload = dataclasses.replace(workload, prompts=args.prompts)
    per_worker = rollout_per_worker(
        args.trajectories, None if args.target == "profile" else workload.trajectories, _WORKERS
    )
    if args.target == "profile" or (args.profile is None and engine == "vllm"):
        model = local_model_dir(args.model or "tiny", None)
        bench_profile(
            model=model, repeats=max(1, args.rounds), seed=args.seed, out=out, name=name,
            batches=grid.batches, contexts=grid.contexts, prefills=grid.prefills,
            workers=_WORKERS, rollout_trajectories=per_worker,
        )  # fmt: skip
        if args.target == "profile":
            return dict(load_profile(measured).raw)
    # The sim engine without a profile runs on the one measured when Heddle was released.
    default = measured if engine == "vllm" else "vllm-cpu-tiny"
    given = args.profile
    ref = str(Path(given).resolve()) if given and Path(given).is_file() else (given or default)
    profile = load_profile(ref)
    cluster_file = None
    if engine == "sim":  # the sim workers run on the same profile, in real time
        cluster_file = out / "cluster-fidelity.yaml"
        cluster_file.write_text(
            f"name: fidelity\ngpus: 2\ntensor_parallel_sizes: [1]\n"
            f"batch_cap: {args.max_num_seqs}\nprofile: {json.dumps(ref)}\n",
            encoding="utf-8",
        )
    options = LocalWorkerOptions(
        speculation=speculation,
        engine=engine,
        model=local_model_dir(args.model or "tiny", None) if engine == "vllm" else None,
        max_model_len=4096 if engine == "vllm" else 1 << 20,
        max_num_seqs=args.max_num_seqs,
        cluster=None if cluster_file is None else str(cluster_file),
        log_dir=out / "logs",
    )
    policies = [p for p in (args.policies or "heddle,verl,slime").split(",") if p]

    def again() -> EngineProfile:
        model = local_model_dir(args.model or "tiny", None)
        after = f"{name}-after"
        bench_profile(
            model=model, repeats=1, seed=args.seed + 1, out=out, name=after,
            batches=grid.batches, contexts=grid.contexts, prefills=grid.prefills,
            workers=_WORKERS, rollout_trajectories=per_worker,
        )  # fmt: skip
        return load_profile(str((out / f"profile-{after}.json").resolve()))

    if args.reprofile and engine != "vllm":
        raise ConfigError("--reprofile measures vLLM workers; drop it with --engine sim")
    result = bench_fidelity(
        workload=workload, profile=profile, policies=policies, options=options, workers=_WORKERS,
        rounds=args.rounds, seed=args.seed, out=out, reprofile=again if args.reprofile else None,
    )  # fmt: skip
    print(format_fidelity(result))
    return result
