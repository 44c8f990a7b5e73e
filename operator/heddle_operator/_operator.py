"""The kopf operator: thin handlers over :mod:`._pools` and :mod:`._jobs`.

Run it with ``heddle operator`` (or ``kopf run -m heddle.operator.handlers``).
Each EnginePool and each RolloutJob gets a kopf daemon; the pool's reconciles
its pods about once a second (read from a kopf index of worker pods by pool,
which kopf's watch keeps current), the job's runs the rollout session. Handlers
are registered on a registry built per operator run, so the module holds no
state and tests start and stop operators freely.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
from prometheus_client import CollectorRegistry, Counter, start_http_server

from heddle.api import (
    ENGINEPOOL_PLURAL,
    FINALIZER,
    GROUP,
    ROLLOUTJOB_PLURAL,
    VERSION,
    JobPhase,
    PodPolicy,
)
from heddle.rollout import HostAllowList, SessionConfig

from ._builders import LABEL_POOL
from ._jobs import JobContext, delete_session_pods, run_job
from ._kube import KubeClient
from ._pools import PoolRuntime, reconcile_pool
from ._session_builders import SessionPodOptions
from ._session_status import SessionPublished

__all__ = ["OperatorConfig", "build_registry", "run_operator"]

log = logging.getLogger("heddle.operator")


# What session pods are told unless the operator is told otherwise: the one source.
_POD = SessionPodOptions()


@dataclass(frozen=True)
class OperatorConfig:
    """Settings of one operator process; times in seconds.

    The fields passed on to session pods take their defaults from
    :class:`SessionPodOptions` (:meth:`session_pod_options` maps them).
    """

    namespaces: tuple[str, ...] = ()  # watched namespaces; empty means the whole cluster
    api_server: str | None = None  # talk to this URL without credentials (tests, kubectl proxy)
    reconcile_interval_s: float = 1.0  # EnginePool reconcile period
    drain_timeout_s: float = 600.0  # a draining instance is deleted after this even if busy
    status_interval_s: float = _POD.status_interval_s  # RolloutJob status patches, at most
    metrics_port: int | None = 9090  # Prometheus /metrics of the operator; None: off
    liveness_endpoint: str | None = None  # e.g. http://0.0.0.0:8080/healthz (kopf's probe)
    scan_cluster: bool = True  # let kopf watch namespaces and CRDs appear (needs list RBAC)
    data_root: Path = _POD.base_dir  # session pods' folder: a job's relative paths resolve in it
    session: SessionConfig = _POD.session  # passed to session pods (frozen: shared safely)
    tool_hosts: HostAllowList = field(default_factory=HostAllowList)  # empty: nowhere
    pod_policy: PodPolicy = field(default_factory=PodPolicy)  # what tenants' pods may ask for
    session_image: str = _POD.image  # session pods' image (the operator's own)
    session_metrics_port: int = _POD.metrics_port  # each session pod's Prometheus port; 0: off
    job_poll_s: float = 1.0  # how often a job's daemon looks at its session pod

    def session_pod_options(self) -> SessionPodOptions:
        """What this operator puts in every session pod."""
        return SessionPodOptions(
            image=self.session_image,
            base_dir=self.data_root,
            status_interval_s=self.status_interval_s,
            metrics_port=self.session_metrics_port,
            session=self.session,
            tool_hosts=self.tool_hosts,
            policy=self.pod_policy,
        )


@dataclass
class _State:
    config: OperatorConfig
    registry: CollectorRegistry
    reconcile_errors: Counter
    reshapes: Counter
    kube: KubeClient | None = None
    info: Any = None
    pools: dict[tuple[str, str], PoolRuntime] = field(default_factory=dict)

    def client(self) -> KubeClient:
        if self.kube is None:
            # kopf logged in through kubernetes.config; this client reads the same credentials
            # the same way (and again when a token is refused), or the test server's URL.
            self.kube = KubeClient(self.info if self.config.api_server else None)
        return self.kube


def build_registry(config: OperatorConfig) -> tuple[kopf.OperatorRegistry, _State]:
    """A kopf registry with Heddle's handlers, and the state they share."""
    registry = kopf.OperatorRegistry()
    metrics_registry = CollectorRegistry()
    state = _State(
        config,
        metrics_registry,
        Counter(
            "heddle_operator_reconcile_errors",
            "failed reconcile rounds",
            ["kind"],
            registry=metrics_registry,
        ),
        Counter(
            "heddle_operator_reshape_steps",
            "reconcile rounds that drained or created instances",
            ["pool"],
            registry=metrics_registry,
        ),
    )

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING
        settings.posting.reporting_component = "heddle-operator"  # kubectl describe: From
        settings.scanning.disabled = not config.scan_cluster
        settings.watching.server_timeout = 300
        # The pod index needs only workers: the server filters the watch (not every pod of
        # the cluster streamed to the operator and dropped there).
        settings.watching.label_selectors["pods"] = LABEL_POOL
        if config.metrics_port is not None:
            start_http_server(config.metrics_port, registry=metrics_registry)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # kopf calls this again whenever the server answers 401: a renewed token is read then.
        info: kopf.ConnectionInfo | None
        if config.api_server:
            info = kopf.ConnectionInfo(server=config.api_server, insecure=True)
        else:
            info = kopf.login_via_client(**kwargs)
        state.info = info
        return info

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        if state.kube is not None:
            await state.kube.aclose()
            state.kube = None

    @kopf.index(
        "", "v1", "pods", id="pool_pods", labels={LABEL_POOL: kopf.PRESENT}, registry=registry
    )
    def pool_pods(
        body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any
    ) -> dict[tuple[str, str], dict[str, Any]]:
        # Worker pods by pool, kept current by kopf's watch: no LIST of pods per round.
        return {(namespace or "default", labels[LABEL_POOL]): copy.deepcopy(dict(body))}

    @kopf.index(GROUP, VERSION, ROLLOUTJOB_PLURAL, id="pool_jobs", registry=registry)
    def pool_jobs(
        body: kopf.Body, name: str, namespace: str | None, **_: Any
    ) -> dict[tuple[str, str], dict[str, Any]]:
        # What each job's session publishes, by pool, kept current by kopf's watch.
        status = dict(body.get("status") or {})
        pool = str((body.get("spec") or {}).get("enginePool", ""))
        return {(namespace or "default", pool): {"name": name, **copy.deepcopy(status)}}

    @kopf.daemon(GROUP, VERSION, ENGINEPOOL_PLURAL, registry=registry, cancellation_timeout=10)
    async def pool_daemon(
        body: kopf.Body,
        name: str,
        namespace: str | None,
        stopped: kopf.DaemonStopped,
        pool_pods: kopf.Index[tuple[str, str], dict[str, Any]] | None = None,  # kopf passes it
        pool_jobs: kopf.Index[tuple[str, str], dict[str, Any]] | None = None,
        **_: Any,
    ) -> None:
        namespace = namespace or "default"
        runtime = state.pools.setdefault((namespace, name), PoolRuntime())
        while not stopped:
            jobs = [] if pool_jobs is None else list(pool_jobs.get((namespace, name), []))
            resident = _follow_session(runtime, jobs)
            before = runtime.reshapes
            try:
                await reconcile_pool(
                    state.client(),
                    body,
                    runtime,
                    resident=resident,
                    drain_timeout_s=config.drain_timeout_s,
                    policy=config.pod_policy,
                    pods=None if pool_pods is None else list(pool_pods.get((namespace, name), [])),
                )
            except Exception:  # a bad round must not end the daemon; the next one retries
                state.reconcile_errors.labels("EnginePool").inc()
                log.warning(
                    "EnginePool %s/%s: reconcile failed; retrying", namespace, name, exc_info=True
                )
            if runtime.reshapes > before:
                state.reshapes.labels(f"{namespace}/{name}").inc(runtime.reshapes - before)
            await stopped.wait(config.reconcile_interval_s)

    @kopf.daemon(GROUP, VERSION, ROLLOUTJOB_PLURAL, registry=registry, cancellation_timeout=30)
    async def job_daemon(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        ctx = JobContext(
            state.client(),
            config.session_pod_options(),
            config.status_interval_s,
            config.job_poll_s,
        )
        await run_job(ctx, body, lambda: bool(stopped), stopped.wait)
        # A finished job's daemon idles until the job goes, so kopf does not restart it.
        while not stopped:
            await stopped.wait(3600)

    @kopf.on.delete(GROUP, VERSION, "rolloutjobs", registry=registry, optional=True)
    async def job_deleted(name: str, namespace: str | None, meta: kopf.Meta, **_: Any) -> None:
        # Owner references take the pod too where a garbage collector runs; this does it
        # at once, and on servers without one.
        gone = await delete_session_pods(
            state.client(), namespace or "default", name, meta.get("uid")
        )
        if gone:
            log.info("RolloutJob %s/%s deleted: deleted its session pods %s",
                     namespace, name, gone)  # fmt: skip
            # The job goes once its session has stopped writing to it: asked again (a fresh
            # read of the job) until no session pod is left.
            raise kopf.TemporaryError(f"waiting for session pods {gone} to stop", delay=1.0)

    return registry, state


def _follow_session(runtime: PoolRuntime, jobs: list[dict[str, Any]]) -> dict[str, int]:
    """Take what the pool's running job published: its planned shape, its start-up
    decisions (for the next job), the checkpoint version per instance, and per instance
    whether trajectories may still live there (0: the session emptied it, or never used
    it; a draining instance may go).

    Only a Running job's status counts: a finished job's session is gone, and whatever
    its status says now was not written by a session the operator started for this pool.
    """
    running = sorted(
        (j for j in jobs if j.get("phase") == JobPhase.RUNNING),
        key=lambda j: str(j.get("startTime", "")),
    )
    if not running:
        return {}
    published = SessionPublished.of_status(running[-1])  # the latest start wins
    runtime.weight_versions.update(published.weight_versions or {})
    if published.planned_shape is not None:
        runtime.planned = published.planned_shape
    if published.decisions is not None:
        runtime.decisions = dict(published.decisions)
    drained = set(published.drained or ())
    return {
        name: (0 if name in drained else max(1, count))
        for name, count in (published.resident or {}).items()
    }


async def run_operator(
    config: OperatorConfig,
    *,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Run until ``stop_flag`` is set (or a signal, when run from the CLI)."""
    registry, _ = build_registry(config)
    namespaces: Collection[str] = config.namespaces
    await kopf.operator(
        registry=registry,
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        liveness_endpoint=config.liveness_endpoint,
    )
