"""``heddle session``: a RolloutJob's session, as its session pod runs it (docs/operator.md)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

from heddle.rollout import DATA_ROOT

__all__ = ["add_session_parser", "session_config_from_env", "session_pod_config"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def session_config_from_env(text: str | None) -> Any:
    """The control loop's knobs from ``HEDDLE_SESSION_CONFIG`` (JSON); unset: the defaults."""
    from heddle.exceptions import ConfigError  # noqa: PLC0415
    from heddle.rollout import SessionConfig  # noqa: PLC0415

    if not text:
        return SessionConfig()
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"HEDDLE_SESSION_CONFIG is not JSON ({exc.msg} at {exc.pos})") from None
    known = {f.name for f in dataclasses.fields(SessionConfig)}
    if not isinstance(values, dict) or set(values) - known:
        unknown = sorted(set(values) - known) if isinstance(values, dict) else values
        raise ConfigError(
            f"HEDDLE_SESSION_CONFIG must be a JSON object of {sorted(known)}; got {unknown!r}"
        )
    return SessionConfig(**values)


def session_pod_config(args: argparse.Namespace, session: Any) -> Any:
    """The :class:`SessionPodConfig` the flags ask for: a flag left out keeps the
    dataclass's default (the operator's, :class:`SessionPodOptions`), written only there."""
    from heddle.operator import SessionPodConfig  # noqa: PLC0415

    given: dict[str, Any] = {
        name: value
        for name, value in (
            ("base_dir", None if args.base_dir is None else Path(args.base_dir)),
            ("status_interval_s", args.status_interval),
            ("metrics_port", args.metrics_port),
            ("gateway_host", args.gateway_host),
            ("gateway_port", args.gateway_port),
            ("trainer_port", args.trainer_port),
        )
        if value is not None
    }
    config = SessionPodConfig(namespace=args.namespace, job=args.job, session=session, **given)
    return dataclasses.replace(config, poll_s=min(1.0, config.status_interval_s))


def _cmd_session(args: argparse.Namespace) -> int:
    from heddle.exceptions import HeddleError  # noqa: PLC0415
    from heddle.operator import (  # noqa: PLC0415
        SESSION_CONFIG_ENV,
        SESSION_RETRY,
        KubeClient,
        run_session_pod,
    )
    from heddle.rollout import SessionMetrics  # noqa: PLC0415

    level = os.environ.get("HEDDLE_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("heddle.session")
    try:
        session = session_config_from_env(os.environ.get(SESSION_CONFIG_ENV))
        kube = KubeClient(
            retry=SESSION_RETRY
        )  # in a pod: its service account; elsewhere: KUBECONFIG
    except HeddleError as exc:
        log.error("%s", exc)
        return 2
    config = session_pod_config(args, session)
    metrics = SessionMetrics()
    if config.metrics_port:
        from prometheus_client import start_http_server  # noqa: PLC0415

        start_http_server(config.metrics_port, registry=metrics.registry)
    signal.signal(signal.SIGTERM, _interrupt)  # the pod deleted: stop, the output closed

    async def main() -> int:
        try:
            return await run_session_pod(config, kube, metrics)
        finally:
            await kube.aclose()

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        return 143
    except HeddleError as exc:  # the API server unreachable, say: the operator starts another
        log.error("%s", exc)
        return 1


def add_session_parser(sub: Any) -> None:
    p = sub.add_parser(
        "session",
        help="run one RolloutJob's session (what its session pod runs)",
        description="Reads the RolloutJob and its EnginePool through the Kubernetes API "
        "(the in-cluster service account, else KUBECONFIG), runs the rollout against the "
        "pool's ready instances and writes the job's status. The worker token comes from "
        "HEDDLE_WORKER_TOKEN, the control loop's knobs from HEDDLE_SESSION_CONFIG (JSON); "
        "the start-up decisions run on no more processes than HEDDLE_CPUS, if set.",
    )
    p.add_argument("--namespace", required=True, help="the job's namespace")
    p.add_argument("--job", required=True, help="the RolloutJob's name")
    # Defaults None: a flag left out keeps SessionPodConfig's default (session_pod_config).
    p.add_argument(
        "--base-dir",
        default=None,
        help=f"folder a job's relative paths resolve in (default: {DATA_ROOT})",
    )
    p.add_argument(
        "--status-interval", type=float, default=None, help="seconds between status patches"
    )
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus port; 0: off")
    p.add_argument(
        "--gateway-host",
        default=None,
        help="where the gateway (external jobs) and the trainer API listen",
    )
    p.add_argument(
        "--gateway-port", type=int, default=None, help="external jobs: the gateway's port"
    )
    p.add_argument(
        "--trainer-port",
        type=int,
        default=None,
        help="serve the trainer API on this port, on the gateway's host, with the token in "
        "HEDDLE_TRAINER_TOKEN (spec.asynchrony.trainerApi; docs/async.md); 0: off",
    )
    p.set_defaults(func=_cmd_session)
