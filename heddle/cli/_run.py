"""``heddle run JOB.yaml``: the command line of local mode (docs/cli.md)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.api import ALLOWED_IMAGES_ENV, ALLOWED_SERVICE_ACCOUNTS_ENV, POD_ALLOW_ENV
from heddle.rollout import DATA_ROOT
from heddle.worker import SPECULATION_METHODS

if TYPE_CHECKING:
    pass

__all__ = ["add_operator_parser", "add_run_parser", "operator_config"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _cmd_run(args: argparse.Namespace) -> int:
    from heddle.rollout import (  # noqa: PLC0415
        DecisionCache,
        GatewayOptions,
        PreviousRollouts,
        ProgressPrinter,
        prepare_job,
        run_local,
    )

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    local = prepare_job(Path(args.job), Path(args.pool) if args.pool else None, args.job_name)
    if args.policy:
        from heddle.scheduler import get_policy  # noqa: PLC0415

        get_policy(args.policy)
        local.job = dataclasses.replace(local.job, policy=args.policy)
    if args.output:
        local.output = Path(args.output)
    if args.trace:
        local.job = dataclasses.replace(local.job, output_trace=True)
    from heddle.rollout import worker_options  # noqa: PLC0415

    options = worker_options(
        local,
        args.engine,
        model=args.model,
        max_model_len=args.max_model_len,
        time_scale=args.time_scale,
        scripted_replies=args.scripted_replies,
        speculation=args.speculation,
    )
    signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl-C: workers stopped, output closed
    printer = ProgressPrinter(local.job.name) if not args.quiet else None
    metrics = None
    if args.metrics_port:
        from prometheus_client import start_http_server  # noqa: PLC0415

        from heddle.rollout import SessionMetrics  # noqa: PLC0415

        metrics = SessionMetrics()
        start_http_server(args.metrics_port, registry=metrics.registry)
    gateway = GatewayOptions(args.gateway_host, args.gateway_port)
    trainer = None if args.trainer_port is None else GatewayOptions(args.gateway_host,
                                                                    args.trainer_port)  # fmt: skip
    try:
        summary, _ = asyncio.run(
            run_local(
                local,
                options,
                on_progress=printer,
                metrics=metrics,
                gateway=gateway,
                on_gateway=_print_gateway(local.job.name, local.pool.model),
                trainer=trainer,
                on_trainer=_print_trainer,
                decisions=DecisionCache(reuse=not args.fresh_decisions),
                history=PreviousRollouts(),
            )
        )
    finally:
        if printer is not None:
            printer.close()
    _print_summary(summary)
    if local.job.output_trace:
        from heddle.rollout import trace_path  # noqa: PLC0415

        print(f"trace: {trace_path(local.output)} (replay: heddle bench --workload THAT_FILE)")
    if summary["policy"] == "heddle":
        pool = f" --pool {args.pool}" if args.pool else ""
        other = local.output.with_name(local.output.stem + "-verl.jsonl")
        print(
            f"compare: heddle run {args.job}{pool} --policy verl --output {other}  "
            "(the same job under verl's step-level scheduling)"
        )
    if args.plot:
        from ._report import plot_rollout  # noqa: PLC0415

        path = plot_rollout(local.output, local.output.with_suffix(".png"))
        print(f"plot: {path}")
    return 0 if summary["progress"]["failed"] == 0 else 1


def _print_gateway(job: str, model: str) -> Any:
    def show(url: str, token: str) -> None:
        # On stdout before any progress: an agent launcher can read these two lines.
        print(f"gateway: {url}  (model {model!r}; OpenAI base_url for job {job}'s agents)")
        print(f"gateway token: {token}  (api_key; set HEDDLE_GATEWAY_TOKEN to choose it)")
        sys.stdout.flush()

    return show


def _print_trainer(url: str, token: str) -> None:
    # On stdout before any progress, as the gateway's: a trainer's launcher reads them.
    print(f"trainer API: {url}  (finished groups and weight pushes: heddle.client.TrainerClient)")
    print(f"trainer token: {token}")
    sys.stdout.flush()


def _print_summary(s: dict[str, Any]) -> None:
    p = s["progress"]
    print(
        f"{s['job']}: {p['done']} done, {p['failed']} failed of {p['total']} trajectories "
        f"({p['resumed']} already in the output) in {p['elapsed_s']:.1f} s on "
        f"{s['pool']['shape']} ({s['pool']['engine']}), policy {s['policy']}"
    )
    print(
        f"  {p['tokens']:,} tokens generated, {s['tokens_per_s_overall']:,.0f} tok/s; "
        f"{s['steps']} steps, {s['migrations']} migrations, {s['recomputes']} recomputes, "
        f"{s['worker_failures']} worker failures"
    )
    m = s["mechanisms"]
    if m["predictor"] != "none":
        print(
            f"  scheduling: {m['re_predictions']:,} re-predictions ({m['predictor']} predictor), "
            f"{m['promotions']:,} steps moved up in priority (longer than predicted); "
            f"placement {m['placement']} re-planned {m['replans']:,} times; "
            f"{m['migrations']} migrations during tool calls; shape {m['shape']} "
            f"({m['shape_source']})"
        )
    else:
        print(
            f"  scheduling: step-level baseline ({m['ordering']} order, {m['placement']} "
            f"routing, no predictor, no migration); shape {m['shape']} ({m['shape_source']})"
        )
    decided = s.get("decisions")
    if decided is not None and decided["reused"]:
        print(
            f"  decisions: shape and co-location reused from an earlier run with the same "
            f"inputs (deciding took {decided['decided_s']:.1f} s then; --fresh-decisions "
            "decides again)"
        )
    elif decided is not None:
        print(
            f"  decisions: decided in {s['decisions_s']:.1f} s, kept for the next run with the "
            "same inputs"
        )
    if s.get("history_records"):
        print(
            f"  started from the pool's previous rollout: {s['history_records']:,} "
            "trajectories (.heddle/history)"
        )
    d, c = s.get("drafts"), s.get("colocation")
    if d is not None or c is not None:  # the speculation decisions (docs/speculation.md)
        parts = []
        if d is not None:
            parts.append(
                f"drafts sent {d['texts_sent']:,} texts, refused {d['texts_refused']:,} as not "
                f"paying, {d['texts_failed']:,} in failed calls"
            )
        if c is not None:
            parts.append(f"co-location of groups {c['reason']}")
        print(f"  speculation: {'; '.join(parts)}")
    r = s.get("rewards")
    if r and r["scored"]:
        unscored = f" ({r['unscored']} unscored: see reward_error)" if r["unscored"] else ""
        print(
            f"  rewards: mean {r['mean']:.3f} over {r['scored']} scored trajectories{unscored}; "
            f"{r['groups']} groups: {r['groups_with_spread']} with a spread (GRPO learns from "
            f"these), {r['groups_all_best']} all rewarded, {r['groups_all_zero']} all zero; "
            f"mean group std {r['mean_group_std']:.3f}"
        )
    elif r:
        print(f"  rewards: none of {r['unscored']} trajectories scored (see reward_error)")
    for error in s["malformed_tasks"][:5]:
        print(f"  skipped task: {error}")
    for failure in s["failures"][:5]:
        print(f"  failed: {failure}")
    print(f"output: {s['output']} (summary: {s['output']}.summary.json)")
    sys.stdout.flush()


def add_run_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a RolloutJob on local workers (no cluster)",
        description="Local mode: start workers for the EnginePool's shape, run the RolloutJob, "
        "write its JSONL output and a summary, stop the workers (docs/cli.md).",
    )
    p.add_argument("job", help="YAML file with the RolloutJob (and optionally its EnginePool)")
    p.add_argument("--pool", default=None, help="YAML file with the EnginePool")
    p.add_argument("--job-name", default=None, help="which RolloutJob, if the file holds several")
    p.add_argument("--engine", choices=("vllm", "sim"), default="vllm", help="local engine")
    p.add_argument("--model", default=None, help="vllm: a model directory (default: the pool's)")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context cap per worker (default: the pool's, at most 4096 on vllm; 65536 on sim, "
        "whose tokens are bytes)",
    )
    p.add_argument(
        "--speculation",
        choices=SPECULATION_METHODS,
        default=None,
        help="vllm: override the pool's spec.speculation.method (off, ngram, suffix, auto), "
        "keeping its K (docs/speculation.md)",
    )
    p.add_argument("--time-scale", type=float, default=1.0, help="sim: scale the model's times")
    p.add_argument(
        "--scripted-replies",
        action="store_true",
        help="sim: answer turn k with the conversation's k-th <reply>...</reply> block "
        "(try an agent without a model: docs/gateway.md)",
    )
    p.add_argument("--policy", default=None, help="override spec.scheduling.policy (A/B runs)")
    p.add_argument("--output", default=None, help="override spec.output.path")
    p.add_argument(
        "--trace",
        action="store_true",
        help="also write the token trace (each step's token ids, timings, finish reason) "
        "beside the output, as spec.output.trace does: OUTPUT.trace.jsonl",
    )
    p.add_argument("--plot", action="store_true", help="also write a PNG next to the output")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument(
        "--fresh-decisions",
        action="store_true",
        help="decide the pool's shape and co-location afresh instead of reusing what an "
        "earlier run with the same inputs decided (kept in .heddle/decisions; "
        "docs/speculation.md)",
    )
    p.add_argument(
        "--metrics-port", type=int, default=0, help="serve Prometheus /metrics here while running"
    )
    p.add_argument(
        "--gateway-host",
        default="127.0.0.1",
        help="external jobs: the address the agents' gateway listens on (default: %(default)s)",
    )
    p.add_argument(
        "--gateway-port",
        type=int,
        default=0,
        help="external jobs: the gateway's port (default: a free one, printed)",
    )
    p.add_argument(
        "--trainer-port",
        type=int,
        default=None,
        help="serve the trainer API here (0: a free port, printed; on --gateway-host): a "
        "trainer takes the finished groups and pushes weights (docs/async.md)",
    )
    p.set_defaults(func=_cmd_run)


def _cmd_operator(args: argparse.Namespace) -> int:
    from heddle.operator import run_operator  # noqa: PLC0415

    level = os.environ.get("HEDDLE_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run_operator(operator_config(args)))
    return 0


def operator_config(args: argparse.Namespace) -> Any:
    """The :class:`OperatorConfig` the flags ask for: a flag left out keeps the
    dataclass's default, written only there."""
    from heddle.api import PodPolicy  # noqa: PLC0415
    from heddle.operator import OperatorConfig  # noqa: PLC0415
    from heddle.rollout import HostAllowList  # noqa: PLC0415

    given: dict[str, Any] = {
        name: value
        for name, value in (
            ("metrics_port", args.metrics_port),
            ("drain_timeout_s", args.drain_timeout),
            ("data_root", None if args.data_root is None else Path(args.data_root)),
            ("session_image", args.session_image or None),
            ("session_metrics_port", args.session_metrics_port),
        )
        if value is not None
    }
    if given.get("metrics_port") == 0:
        given["metrics_port"] = None  # --metrics-port 0: off
    return OperatorConfig(
        namespaces=tuple(args.namespace),
        api_server=args.api_server,
        liveness_endpoint=args.liveness,
        scan_cluster=not args.no_scan,
        tool_hosts=(
            HostAllowList.parse(args.tool_allowed_hosts, "--tool-allowed-hosts")
            if args.tool_allowed_hosts is not None
            else HostAllowList.from_env()
        ),
        pod_policy=PodPolicy.parse(
            args.allowed_images, args.allowed_service_accounts, args.pod_allow
        ),
        **given,
    )


def add_operator_parser(sub: Any) -> None:
    p = sub.add_parser(
        "operator",
        help="run the Kubernetes operator (EnginePool, RolloutJob)",
        description="The kopf operator of docs/operator.md. Credentials: the in-cluster "
        "service account, else KUBECONFIG.",
    )
    p.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable); default: the whole cluster",
    )
    # Defaults None: a flag left out keeps OperatorConfig's default (operator_config).
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus port; 0: off")
    p.add_argument(
        "--liveness", default="http://0.0.0.0:8080/healthz", help="kopf's liveness endpoint"
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        help="seconds a draining instance may keep trajectories before it is deleted anyway",
    )
    p.add_argument(
        "--tool-allowed-hosts",
        default=None,
        metavar="LIST",
        help="hosts, *.suffixes and CIDRs tool calls may reach, comma-separated; '*': any "
        "(default: $HEDDLE_TOOL_ALLOWED_HOSTS; empty: none)",
    )
    p.add_argument(
        "--allowed-images",
        default=os.environ.get(ALLOWED_IMAGES_ENV, ""),
        metavar="LIST",
        help="images pools and jobs may run: 'registry/' prefixes, repositories or images, "
        "comma-separated; '*': any (default: $HEDDLE_ALLOWED_IMAGES, else ghcr.io/heddle-dev/)",
    )
    p.add_argument(
        "--allowed-service-accounts",
        default=os.environ.get(ALLOWED_SERVICE_ACCOUNTS_ENV, ""),
        metavar="LIST",
        help="ServiceAccounts a job's session or a pool's pod template may name besides the "
        "namespace's default (default: $HEDDLE_ALLOWED_SERVICE_ACCOUNTS)",
    )
    p.add_argument(
        "--pod-allow",
        default=os.environ.get(POD_ALLOW_ENV, ""),
        metavar="LIST",
        help="pod fields tenants may use that are refused by default: hostNetwork, hostPath, "
        "secretVolumes, serviceAccountToken, otherVolumes, capabilities "
        "(default: $HEDDLE_POD_ALLOW; docs/security.md)",
    )
    p.add_argument(
        "--data-root",
        default=None,
        help="session pods' folder: a RolloutJob's relative paths (tasks, workload, output) "
        f"resolve inside it, on the pod's volumes (default: {DATA_ROOT})",
    )
    p.add_argument(
        "--session-image",
        default=os.environ.get("HEDDLE_SESSION_IMAGE") or None,
        help="image of session pods without spec.session.image (default: "
        "$HEDDLE_SESSION_IMAGE, which the chart sets to the operator's own image)",
    )
    p.add_argument(
        "--session-metrics-port",
        type=int,
        default=None,
        help="Prometheus port of each session pod; 0: off",
    )
    p.add_argument("--api-server", default=None, help="API server URL without auth (tests)")
    p.add_argument(
        "--no-scan", action="store_true", help="do not list namespaces/CRDs (needs less RBAC)"
    )
    p.set_defaults(func=_cmd_operator)
