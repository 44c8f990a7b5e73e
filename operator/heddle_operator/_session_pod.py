"""The session pod: one RolloutJob's rollout session, in a pod of the job's namespace.

``heddle session --namespace NS --job NAME`` runs :func:`run_session_pod`. It
reads the job and its EnginePool through the Kubernetes API (credentials as
the operator loads them), the pool's worker endpoints from the pool's status
and the worker token from ``HEDDLE_WORKER_TOKEN`` (a ``secretKeyRef`` to the
pool's Secret: the pod needs no access to Secrets). It builds the session
through the same path as ``heddle run`` (:func:`heddle.rollout.build_session`),
writes the output to the job's own volumes, and patches the job's status
itself. The operator never sees a step: it reads what the session publishes
(``plannedShape``, ``resident``, ``drained``, ``weightVersions``) to reshape
the pool and to know when a draining instance is empty.

A session that restarts (its pod replaced) resumes from the output file:
finished trajectories are skipped, so nothing is lost or written twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from heddle.api import EnginePoolSpec, InstancePhase, JobPhase, RolloutJobSpec
from heddle.exceptions import CheckpointError, ConfigError, HeddleError, ManifestError
from heddle.rollout import (
    DECISIONS_DIR,
    HISTORY_DIR,
    TRAINER_TOKEN_ENV,
    DecidedRun,
    DecisionCache,
    ExternalEnvironment,
    Gateway,
    HostAllowList,
    LocalJob,
    NextDecisions,
    OutputSink,
    PreviousRollouts,
    RolloutSession,
    SessionConfig,
    SessionMetrics,
    TaskSet,
    TrainerServer,
    announce_next,
    build_environment,
    build_session,
    check_tool_hosts,
    decide_run,
    decision_key,
    finished_records,
    job_workload,
    perf_model_for,
    read_decided,
    read_tasks,
    resolve_job,
)
from heddle.scheduler import FinishedTrajectory, PerfModel
from heddle.worker import TOKEN_ENV, WorkerEndpoint

from ._builders import condition, now_iso
from ._job_status import FINISHED, JobStatus, progress_fields
from ._kube import CONFIGMAPS, ENGINEPOOLS, ROLLOUTJOBS, ApiError, KubeClient, RetryPolicy
from ._session_builders import (
    GATEWAY_PORT,
    SessionPodOptions,
    gateway_url,
    trainer_secret_name,
    trainer_url,
)
from ._session_status import SessionPublished

__all__ = ["SESSION_RETRY", "SessionPodConfig", "ready_workers", "run_session_pod"]

log = logging.getLogger("heddle.session")

_POD = SessionPodOptions()  # what the operator passes unless told otherwise
# One object per request: a server that has not answered in 5 s is asked again next round
# (the rollout never waits on the API server; a status round is skipped at worst).
SESSION_RETRY = RetryPolicy(timeout_s=5.0)
FINAL_WRITE_ATTEMPTS = 8


@dataclass(frozen=True)
class SessionPodConfig:
    """What ``heddle session`` is told; times in seconds. What the operator passes on
    defaults to what it passes (:class:`SessionPodOptions`): one source."""

    namespace: str
    job: str
    base_dir: Path = _POD.base_dir  # relative paths of the job resolve inside it
    status_interval_s: float = _POD.status_interval_s  # status patches at most this often
    poll_s: float = 1.0  # how often the pool's status is read
    settle_s: float = 30.0  # at most this long for the whole pool once an instance is ready
    session: SessionConfig = field(default_factory=SessionConfig)
    gateway_host: str = "0.0.0.0"  # an external job's gateway: the pod's every address
    gateway_port: int = GATEWAY_PORT
    gateway_linger_s: float = 3.0  # served on after the end, so polling agents hear of it
    trainer_port: int = 0  # the trainer API's port (token: HEDDLE_TRAINER_TOKEN); 0: off
    metrics_port: int = _POD.metrics_port  # Prometheus /metrics (``heddle session``); 0: off
    # Once the job's final status is written, take the pool's next job's start-up
    # decisions on this rollout (kept on the job's volume; the trainer trains meanwhile).
    decide_ahead: bool = True


def ready_workers(
    pool_body: Mapping[str, Any], token: str | None = None
) -> dict[str, WorkerEndpoint]:
    return {
        i["name"]: WorkerEndpoint(i["name"], i["endpoint"], int(i["tp"]), token)
        for i in (pool_body.get("status") or {}).get("instances", [])
        if i.get("phase") == InstancePhase.READY and i.get("endpoint")
    }


def _draining(pool_body: Mapping[str, Any]) -> set[str]:
    return {
        i["name"]
        for i in (pool_body.get("status") or {}).get("instances", [])
        if i.get("phase") in (InstancePhase.DRAINING, InstancePhase.FAILED)
    }


async def run_session_pod(
    config: SessionPodConfig, kube: KubeClient, metrics: SessionMetrics | None = None
) -> int:
    """Run the job's session to its end; the exit code (0: the job reached a final phase)."""
    body = await kube.get(ROLLOUTJOBS, config.namespace, config.job)
    if body is None:
        log.error("RolloutJob %s/%s does not exist", config.namespace, config.job)
        return 1
    status = JobStatus(kube, body, config.status_interval_s)
    if status.phase in FINISHED:
        return 0
    try:
        job = RolloutJobSpec.from_manifest(body)
        check_tool_hosts(job, HostAllowList.from_env())
        job_workload(job, lambda name: config.base_dir / name)  # a bad file is a bad spec
    except HeddleError as exc:
        await status.write(JobPhase.FAILED, [condition("Valid", False, "InvalidSpec", str(exc))],
                           completionTime=now_iso())  # fmt: skip
        return 0
    try:
        await _run(config, kube, job, status, metrics or SessionMetrics())
    except CheckpointError as exc:
        await status.write(JobPhase.FAILED, [condition("WeightsLoaded", False,
                           "CheckpointNotLoaded", str(exc))], completionTime=now_iso())  # fmt: skip
    except HeddleError as exc:
        await status.write(JobPhase.FAILED,
                           [condition("Complete", False, "SessionFailed", str(exc))],
                           completionTime=now_iso())  # fmt: skip
    except Exception as exc:  # not Heddle's own: the job fails with a sentence, not a restart loop
        log.error("RolloutJob %s/%s failed", job.namespace, job.name, exc_info=True)
        await status.write(JobPhase.FAILED, [condition("Complete", False, "InternalError",
            f"the session stopped on an unexpected {type(exc).__name__}; "
            "the session pod's log has the details",
        )], completionTime=now_iso())  # fmt: skip
    return 0


async def _tasks(kube: KubeClient, job: RolloutJobSpec) -> TaskSet | None:
    if job.tasks.config_map is None:
        return None  # inline, a file on the pod's volumes, or the synthetic workload's
    name, key = job.tasks.config_map
    cm = await kube.get(CONFIGMAPS, job.namespace, name)
    if cm is None or key not in (cm.get("data") or {}):
        raise ManifestError(
            f"ConfigMap {name!r} with key {key!r} not found in namespace {job.namespace}; "
            "create it or fix spec.tasks.configMap"
        )
    return read_tasks(text=cm["data"][key])


def _pool_ready(pool_body: Mapping[str, Any]) -> bool:
    """The pool's Ready condition: every instance of its desired shape ready."""
    conditions = (pool_body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def _wait_for_pool(
    kube: KubeClient, job: RolloutJobSpec, status: JobStatus, poll_s: float, settle_s: float
) -> dict[str, Any]:
    valid = condition("Valid", True, "SpecValid", "the spec is valid")
    first_ready = 0.0  # when an instance was first seen ready
    while True:
        pool_body = await kube.get(ENGINEPOOLS, job.namespace, job.engine_pool)
        if pool_body is None:
            await status.write(JobPhase.PENDING, [valid, condition(
                "PoolReady", False, "PoolNotFound",
                f"EnginePool {job.engine_pool!r} does not exist in namespace {job.namespace}; "
                "create it or fix spec.enginePool",
            )], force=status.phase is not JobPhase.PENDING)  # fmt: skip
        elif not ready_workers(pool_body):
            await status.write(JobPhase.PENDING, [valid, condition(
                "PoolReady", False, "NoReadyInstances",
                f"EnginePool {job.engine_pool!r} has no ready instance yet",
            )], force=status.phase is not JobPhase.PENDING)  # fmt: skip
        else:
            first_ready = first_ready or time.monotonic()
            # The whole pool if it comes soon (every instance then loads the job's weights
            # before the first step), else what is ready: the rest joins as it comes.
            if _pool_ready(pool_body) or time.monotonic() - first_ready >= settle_s:
                return pool_body
        await asyncio.sleep(poll_s)


async def _run(
    config: SessionPodConfig,
    kube: KubeClient,
    job: RolloutJobSpec,
    status: JobStatus,
    metrics: SessionMetrics,
) -> None:
    pool_body = await _wait_for_pool(kube, job, status, config.poll_s, config.settle_s)
    pool = EnginePoolSpec.from_manifest(pool_body)
    local = resolve_job(
        job, pool, await _tasks(kube, job), config.base_dir, tool_hosts=HostAllowList.from_env()
    )
    perf = perf_model_for(pool)
    # The pool's previous rollout, kept on the job's own volume under the data root.
    local = replace(local, history=_history(config).get(_history_name(job)))
    # Mini-simulations (seconds to a minute, on worker processes): off the loop, which
    # keeps writing the job's status meanwhile.
    earlier = _earlier_decisions(pool_body, local, perf)
    decided = await asyncio.to_thread(
        decide_run, local, perf, earlier=earlier, cache=_decisions(config)
    )
    plan, colocation = decided.plan, decided.colocation
    # The decisions go to the pool's status through the operator: the next job reuses them.
    published = SessionPublished(decisions=decided.as_dict())
    if pool.shape is None:  # the operator reshapes the pool to it (docs/operator.md)
        published = replace(published, planned_shape=plan.shape)
    planned: dict[str, Any] = published.fields()
    token = os.environ.get(TOKEN_ENV) or None
    workers = ready_workers(pool_body, token)
    # What instances loaded before (an earlier job's checkpoint), so they are not loaded again.
    versions = {
        i["name"]: str(i["weightVersion"])
        for i in (pool_body.get("status") or {}).get("instances", [])
        if i.get("weightVersion") is not None
    }
    environment = build_environment(local)
    session = build_session(
        local,
        list(workers.values()),
        OutputSink(local.output, follow_symlinks=False),
        plan=plan,
        perf=perf,
        environment=environment,
        config=config.session,
        metrics=metrics,
        weight_versions=versions,
        colocation=colocation,
    )
    served: Gateway | None = None
    if isinstance(environment, ExternalEnvironment):
        # The agents reach it through the job's Service (the operator made it and the
        # token's Secret); the token came in HEDDLE_GATEWAY_TOKEN from that Secret.
        served = Gateway(environment, config.gateway_host, config.gateway_port)
        await served.start()
        planned["gatewayURL"] = gateway_url(job)
    trainer: TrainerServer | None = None
    if config.trainer_port:
        # Before the run: a served trainer takes the groups (none is taken for it). The
        # token came from the job's Secret (the operator made it); never a generated one,
        # which no trainer could read.
        token_of_trainer = os.environ.get(TRAINER_TOKEN_ENV)
        if not token_of_trainer:
            raise ConfigError(
                f"--trainer-port needs the trainer API's token in {TRAINER_TOKEN_ENV} "
                f"(the Secret {trainer_secret_name(job.name)})"
            )
        trainer = TrainerServer(session, token=token_of_trainer, host=config.gateway_host,
                                port=config.trainer_port)  # fmt: skip
        await trainer.start()
        planned["trainer"] = {
            "url": trainer_url(job.name, job.namespace),
            "tokenSecret": trainer_secret_name(job.name),
        }
    running = [
        condition("Valid", True, "SpecValid", "the spec is valid"),
        condition("PoolReady", True, "InstancesReady", f"{len(workers)} instances"),
        condition("Running", True, "SessionRunning", _running(job.policy, plan.policy)),
    ]

    def keep(records: list[FinishedTrajectory]) -> NextDecisions | None:
        # Before the final status: the pool's next job starts from this rollout, and
        # (decide_ahead) finds its decisions announced, to wait for rather than take.
        _history(config).put(_history_name(job), records)
        kept = _history(config).get(_history_name(job))
        if not (config.decide_ahead and kept):
            return None
        return announce_next(replace(local, history=kept), perf, None, _decisions(config),
                             decided.decided_s)  # fmt: skip

    try:
        await status.write(JobPhase.RUNNING, running, startTime=now_iso(), **planned)
        ahead = await _drive(config, kube, local, session, status, workers, token, keep)
        if served is not None or trainer is not None:
            await asyncio.sleep(config.gateway_linger_s)
    finally:
        if served is not None:
            await asyncio.shield(served.stop())
        if trainer is not None:
            await asyncio.shield(trainer.stop())
    if ahead is not None:
        await asyncio.to_thread(_decide_next, job, ahead)


def _decide_next(job: RolloutJobSpec, ahead: NextDecisions) -> None:
    """The pool's next job's decisions, on this rollout; a failure costs that job only
    its head start (it decides itself, as it would have)."""
    log.info("%s: taking the pool's next job's start-up decisions ahead, on this rollout",
             job.name)  # fmt: skip
    try:
        ahead.take()
    except Exception:  # never the finished job's concern: logged, and the pod ends
        log.warning("%s: the next job's decisions were not taken ahead", job.name,
                    exc_info=True)  # fmt: skip


def _history(config: SessionPodConfig) -> PreviousRollouts:
    """Where a pool's previous rollout is kept: under the data root, on the job's volume
    (a pod whose volumes are not writable there keeps none: logged, the prior used)."""
    return PreviousRollouts(config.base_dir / HISTORY_DIR)


def _decisions(config: SessionPodConfig) -> DecisionCache:
    """Where a session pod keeps its start-up decisions, and finds those taken ahead for
    its job: beside the previous rollout, on the job's volume."""
    return DecisionCache(config.base_dir / DECISIONS_DIR)


def _history_name(job: RolloutJobSpec) -> str:
    return f"{job.namespace}.{job.engine_pool}"


def _earlier_decisions(
    pool_body: Mapping[str, Any], local: LocalJob, perf: PerfModel
) -> DecidedRun | None:
    """The pool's kept decisions for this job's inputs (one of its status.decisions, from
    its latest jobs), checked as untrusted: one that does not hold is logged in one
    sentence and the job decides afresh."""
    kept = (pool_body.get("status") or {}).get("decisions")
    key = decision_key(local, perf)
    name = (pool_body.get("metadata") or {}).get("name", "?")
    for data in kept if isinstance(kept, list) else []:
        if isinstance(data, Mapping) and data.get("key") == key:
            try:
                return read_decided(data, local, f"EnginePool {name} status.decisions")
            except ConfigError as exc:
                log.warning("%s; deciding afresh", str(exc).split("\n", 1)[0])
                return None
    return None


async def _drive(
    config: SessionPodConfig,
    kube: KubeClient,
    local: LocalJob,
    session: RolloutSession,
    status: JobStatus,
    workers: dict[str, WorkerEndpoint],
    token: str | None,
    keep: Callable[[list[FinishedTrajectory]], NextDecisions | None],
) -> NextDecisions | None:
    """Run the session to its end and write the final status; what ``keep`` returned
    (given the finished records before the final status)."""
    job = local.job
    task = asyncio.create_task(session.run())
    loaded: list[dict[str, str]] = []  # the WeightsLoaded condition, once written
    next_poll = 0.0
    try:
        while not task.done():
            try:
                if time.monotonic() >= next_poll:
                    await _sync_workers(kube, job, session, workers, token)
                    next_poll = time.monotonic() + config.poll_s
                if not loaded and (weights := _weights_loaded(job, session)):
                    await status.write(JobPhase.RUNNING, weights)
                    loaded = weights
                await status.write(
                    JobPhase.RUNNING, force=False, **progress_fields(session.progress()),
                    **_published(session, workers),
                )  # fmt: skip
            except ApiError as exc:  # the API server slow or away: the rollout goes on
                log.warning("%s: status not written this round: %s", job.name, exc)
            await asyncio.wait({task}, timeout=min(config.status_interval_s, config.poll_s))
        result = await task
        ahead = keep(finished_records(session.runs.values()))
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    p = result.progress
    message = f"{p.done} done, {p.failed} failed of {p.total}"
    if result.deadline_hit:
        message += " (deadline reached: unfinished ones recorded as truncated)"
    final = [
        *(loaded or _weights_loaded(job, session)),  # a job quicker than a status round
        condition("Running", False, "Finished", message),
        condition("Complete", True, "AllRecorded", message),
    ]
    for attempt in range(FINAL_WRITE_ATTEMPTS):  # the end must be told; a restart would re-read
        try:
            await status.write(
                JobPhase.SUCCEEDED, final, completionTime=now_iso(), **progress_fields(p),
                **_published(session, workers),
            )  # fmt: skip
            return ahead
        except ApiError as exc:
            log.warning("%s: the final status not written (%s); trying again", job.name, exc)
            await asyncio.sleep(min(2.0**attempt, 10.0))
    if ahead is not None:  # this pod fails instead: the next job must not wait for it
        ahead.withdraw()
    raise HeddleError(f"could not write the final status of {job.name} to the API server")


def _published(session: RolloutSession, workers: Mapping[str, WorkerEndpoint]) -> dict[str, Any]:
    """What the operator reads from the job: unfinished trajectories per instance, the
    instances this session stopped using and emptied (a draining one may then go), and
    the checkpoint version each instance loaded."""
    return SessionPublished(
        resident={name: session.resident_on(name) for name in sorted(workers)},
        drained=tuple(session.drained()),
        weight_versions=dict(session.weights.versions),
        replans=session.replans,
    ).fields()


def _weights_loaded(job: RolloutJobSpec, session: RolloutSession) -> list[dict[str, str]]:
    """``WeightsLoaded`` once the session's first round of loads is over, else nothing."""
    if job.weights is None or not session.weights.ready.is_set():
        return []
    return [condition("WeightsLoaded", True, "CheckpointLoaded",
        f"version {job.weights.version} from {job.weights.path} on "
        f"{sum(v == job.weights.version for v in session.weights.versions.values())} instances",
    )]  # fmt: skip


async def _sync_workers(
    kube: KubeClient,
    job: RolloutJobSpec,
    session: RolloutSession,
    known: dict[str, WorkerEndpoint],
    token: str | None,
) -> None:
    """Follow the pool's status: new instances join, draining ones drain, gone ones leave."""
    pool_body = await kube.get(ENGINEPOOLS, job.namespace, job.engine_pool)
    if pool_body is None:
        return
    ready = ready_workers(pool_body, token)
    draining = _draining(pool_body)
    for name, endpoint in ready.items():
        if known.get(name) != endpoint:
            if name in known:
                session.remove_worker(name)
            session.add_worker(endpoint)
            known[name] = endpoint
    for name in list(known):
        if name in draining:
            session.drain_worker(name)
        elif name not in ready:
            session.remove_worker(name)
            known.pop(name)


def _running(asked: str, ran: str) -> str:
    if asked == ran:
        return f"policy {asked}"
    # The shape planner predicted the job's policy would not beat this one on the shape.
    return f"policy {ran} (the shape planner's choice for policy {asked}; docs/scheduler.md)"
