"""RolloutJob lifecycle: validate, queue per pool, run the session, keep status current.

:func:`run_job` is the body of the job's kopf daemon. It returns when the job
reached Succeeded or Failed; the daemon stops with the job (deletion, or the
operator exiting) by cancellation, which stops the session. A restarted
operator starts the daemon again and the session resumes from the output
file, so no trajectory is lost or written twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heddle.api._manifests import EnginePoolSpec, RolloutJobSpec, check_trajectories
from heddle.exceptions import CheckpointError, HeddleError, ManifestError
from heddle.rollout._environments import synthetic_tasks
from heddle.rollout._hosts import HostAllowList, check_tool_hosts
from heddle.rollout._output import OutputSink
from heddle.rollout._paths import confine
from heddle.rollout._progress import Progress, SessionMetrics
from heddle.rollout._run import LocalJob, build_environment, job_workload, perf_model_for, plan_pool
from heddle.rollout._session import RolloutSession, SessionConfig
from heddle.rollout._tasks import TaskSet, read_tasks
from heddle.scheduler import WorkloadSpec
from heddle.worker._client import WorkerEndpoint

from ._builders import condition, merge_conditions, now_iso
from ._kube import CONFIGMAPS, ENGINEPOOLS, ROLLOUTJOBS, KubeClient
from ._pools import PoolRuntime
from ._tokens import read_worker_token

__all__ = ["JobContext", "run_job"]

log = logging.getLogger("heddle.operator.jobs")
FINISHED = ("Succeeded", "Failed")


@dataclass
class JobContext:
    """What a job's daemon shares with the rest of the operator."""

    kube: KubeClient
    pools: dict[tuple[str, str], PoolRuntime]
    sessions: dict[tuple[str, str], RolloutSession]  # by (namespace, pool)
    metrics: SessionMetrics
    session_config: SessionConfig
    data_root: Path  # every path a job names lies under it
    status_interval_s: float = 1.0
    poll_s: float = 1.0
    tool_hosts: HostAllowList | None = None  # where tool calls may go; None: anywhere


@dataclass(frozen=True)
class _Files:
    """A job's paths, confined to the data root, and its workload (read once, up front)."""

    output: Path
    tasks: Path | None
    workload: WorkloadSpec | None


def _files(ctx: JobContext, job: RolloutJobSpec) -> _Files:
    root = ctx.data_root
    output = confine(job.output_path, root, "spec.output.path")
    tasks = confine(job.tasks.path, root, "spec.tasks.path") if job.tasks.path else None
    workload = job_workload(
        job, lambda name: confine(name, root, "spec.environment.synthetic.workload")
    )
    return _Files(output, tasks, workload)


async def _output_holder(ctx: JobContext, body: Mapping[str, Any], output: Path) -> str | None:
    """The name of an earlier unfinished job of the namespace writing to the same output."""
    meta = body["metadata"]
    mine = (meta.get("creationTimestamp", ""), meta["name"])
    for other in await ctx.kube.list(ROLLOUTJOBS, meta.get("namespace", "default")):
        m = other["metadata"]
        path = ((other.get("spec") or {}).get("output") or {}).get("path")
        if (
            m["name"] == meta["name"]
            or not isinstance(path, str)
            or (other.get("status") or {}).get("phase") in FINISHED
            or m.get("deletionTimestamp")
            or (m.get("creationTimestamp", ""), m["name"]) > mine
        ):
            continue
        with contextlib.suppress(ManifestError, ValueError, OSError):
            if confine(path, ctx.data_root, "spec.output.path") == output:
                return str(m["name"])
    return None


class _Status:
    """Status patches of one job, at most one per ``interval_s`` unless forced."""

    def __init__(self, ctx: JobContext, body: Mapping[str, Any]) -> None:
        self.ctx = ctx
        meta = body["metadata"]
        self.namespace, self.name = meta.get("namespace", "default"), meta["name"]
        self.generation = meta.get("generation")
        self.conditions: list[dict[str, Any]] = list(
            (body.get("status") or {}).get("conditions", [])
        )
        self.last = 0.0
        self.phase = (body.get("status") or {}).get("phase")

    async def write(
        self,
        phase: str,
        conditions: Sequence[Mapping[str, Any]] = (),
        force: bool = True,
        **fields: Any,
    ) -> None:
        now = time.monotonic()
        if not force and phase == self.phase and now - self.last < self.ctx.status_interval_s:
            return
        if phase == "Failed" and conditions:
            # `kubectl wait --for=condition=Failed` as for a batch Job: the cause, again.
            cause = conditions[-1]
            conditions = [
                *conditions,
                condition("Failed", True, str(cause["reason"]), str(cause["message"])),
            ]
        self.conditions = merge_conditions(self.conditions, conditions, generation=self.generation)
        status = {
            "phase": phase,
            "observedGeneration": self.generation,
            "conditions": self.conditions,
        }
        status.update(fields)
        await self.ctx.kube.patch(
            ROLLOUTJOBS, self.namespace, self.name, {"status": status}, status=True
        )
        self.last, self.phase = now, phase


def _progress_fields(p: Progress) -> dict[str, Any]:
    return {
        "total": p.total,
        "queued": p.queued,
        "running": p.generating,
        "inTool": p.in_tool,
        "done": p.done,
        "failed": p.failed,
        "progress": f"{p.done + p.failed}/{p.total}",
        "tokens": p.tokens,
        "tokensPerSecond": round(p.tokens_per_s),
        "elapsedSeconds": round(p.elapsed_s, 1),
        **({"etaSeconds": round(p.eta_s, 1)} if p.eta_s is not None else {}),
    }


async def _first_in_queue(ctx: JobContext, body: Mapping[str, Any], pool: str) -> str | None:
    """The name of the job ahead of this one on its pool, if any (creation order)."""
    meta = body["metadata"]
    jobs = await ctx.kube.list(ROLLOUTJOBS, meta.get("namespace", "default"))
    waiting = [
        j
        for j in jobs
        if (j.get("spec") or {}).get("enginePool") == pool
        and (j.get("status") or {}).get("phase") not in FINISHED
        and not j["metadata"].get("deletionTimestamp")
    ]
    waiting.sort(key=lambda j: (j["metadata"].get("creationTimestamp", ""), j["metadata"]["name"]))
    if waiting and waiting[0]["metadata"]["name"] != meta["name"]:
        return str(waiting[0]["metadata"]["name"])
    return None


async def _tasks(ctx: JobContext, job: RolloutJobSpec, files: _Files) -> TaskSet:
    if job.tasks.inline is not None:
        return read_tasks(inline=job.tasks.inline)
    if files.tasks is not None:
        return read_tasks(path=files.tasks)
    if job.tasks.config_map is not None:
        name, key = job.tasks.config_map
        cm = await ctx.kube.get(CONFIGMAPS, job.namespace, name)
        if cm is None or key not in (cm.get("data") or {}):
            raise ManifestError(
                f"ConfigMap {name!r} with key {key!r} not found in namespace {job.namespace}; "
                "create it or fix spec.tasks.configMap"
            )
        return read_tasks(text=cm["data"][key])
    return TaskSet([], [])


def _ready_workers(
    pool_body: Mapping[str, Any], token: str | None = None
) -> dict[str, WorkerEndpoint]:
    return {
        i["name"]: WorkerEndpoint(i["name"], i["endpoint"], int(i["tp"]), token)
        for i in (pool_body.get("status") or {}).get("instances", [])
        if i.get("phase") == "Ready" and i.get("endpoint")
    }


async def _token(ctx: JobContext, job: RolloutJobSpec) -> str | None:
    return await read_worker_token(ctx.kube, job.namespace, job.engine_pool)


def _draining(pool_body: Mapping[str, Any]) -> set[str]:
    return {
        i["name"]
        for i in (pool_body.get("status") or {}).get("instances", [])
        if i.get("phase") in ("Draining", "Failed")
    }


async def run_job(
    ctx: JobContext,
    body: Mapping[str, Any],
    stopped: Callable[[], bool],
    sleep: Callable[[float], Awaitable[Any]],
) -> None:
    status = _Status(ctx, body)
    if status.phase in FINISHED:
        return
    try:
        job = RolloutJobSpec.from_manifest(body)
        check_tool_hosts(job, ctx.tool_hosts)
        if job.environment.type == "external":
            raise ManifestError(
                "environment.type external needs its gateway served as a Service of the "
                "job's session, which the operator does not do yet (sessions run in its own "
                "process); run the job with `heddle run` (docs/gateway.md) or use type tools"
            )
        files = _files(ctx, job)
    except HeddleError as exc:
        await status.write("Failed", [condition("Valid", False, "InvalidSpec", str(exc))])
        return
    holder = await _output_holder(ctx, body, files.output)
    if holder is not None:
        await status.write("Failed", [condition("Valid", False, "OutputInUse",
            f"RolloutJob {holder!r} writes to the same spec.output.path {job.output_path!r}; "
            "give this job its own output path",
        )])  # fmt: skip
        return
    valid = condition("Valid", True, "SpecValid", "the spec is valid")
    # Wait for the pool and for our turn on it.
    while not stopped():
        ahead = await _first_in_queue(ctx, body, job.engine_pool)
        pool_body = await ctx.kube.get(ENGINEPOOLS, job.namespace, job.engine_pool)
        if ahead is not None:
            await status.write("Queued", [valid, condition(
                "Running", False, "WaitingForPool",
                f"job {ahead!r} runs on pool {job.engine_pool!r} first",
            )])  # fmt: skip
        elif pool_body is None:
            await status.write("Pending", [valid, condition(
                "PoolReady", False, "PoolNotFound",
                f"EnginePool {job.engine_pool!r} does not exist in namespace {job.namespace}; "
                "create it or fix spec.enginePool",
            )])  # fmt: skip
        elif not _ready_workers(pool_body):
            await status.write("Pending", [valid, condition(
                "PoolReady", False, "NoReadyInstances",
                f"EnginePool {job.engine_pool!r} has no ready instance yet",
            )])  # fmt: skip
        else:
            break
        await sleep(ctx.poll_s)
    if stopped():
        return
    assert pool_body is not None
    try:
        await _run_session(ctx, job, files, pool_body, status, stopped, sleep, valid)
    except CheckpointError as exc:
        await status.write("Failed", [condition("WeightsLoaded", False, "CheckpointNotLoaded",
                           str(exc))], completionTime=now_iso())  # fmt: skip
    except HeddleError as exc:
        await status.write("Failed", [condition("Complete", False, "SessionFailed", str(exc))],
                           completionTime=now_iso())  # fmt: skip
    except Exception as exc:  # not Heddle's own: fail the job rather than let kopf retry forever
        log.error("RolloutJob %s/%s failed", job.namespace, job.name, exc_info=True)
        await status.write("Failed", [condition("Complete", False, "InternalError",
            f"the session stopped on an unexpected {type(exc).__name__}; "
            "the operator's log has the details",
        )], completionTime=now_iso())  # fmt: skip


async def _run_session(
    ctx: JobContext,
    job: RolloutJobSpec,
    files: _Files,
    pool_body: Mapping[str, Any],
    status: _Status,
    stopped: Callable[[], bool],
    sleep: Callable[[float], Awaitable[Any]],
    valid: dict[str, str],
) -> None:
    pool = EnginePoolSpec.from_manifest(pool_body)
    tasks = await _tasks(ctx, job, files)
    local = LocalJob(job, pool, tasks, files.workload, files.output, ctx.data_root)
    synthetic = job.environment.synthetic
    where = f"RolloutJob {job.name!r}"
    if synthetic is not None and not tasks.tasks and local.workload is not None:
        check_trajectories(local.workload.prompts, job.samples_per_task, where)
        local.tasks = TaskSet(
            synthetic_tasks(local.workload.prompts, local.workload, synthetic.seed), []
        )
    check_trajectories(len(local.tasks.tasks), job.samples_per_task, where)
    perf = perf_model_for(pool)
    key = (job.namespace, job.engine_pool)
    runtime = ctx.pools.setdefault(key, PoolRuntime())
    policy, in_flight = job.policy, None
    if pool.shape is None:
        plan = await asyncio.to_thread(plan_pool, local, perf)  # mini-simulations
        runtime.planned = plan.shape
        policy, in_flight = plan.policy, plan.max_trajectories_in_flight
    # The pool's token, read again at every sync: a new one (the Secret made again)
    # reaches the instances started with it.
    workers = _ready_workers(pool_body, await _token(ctx, job))
    session = RolloutSession(
        job=job.name,
        tasks=local.tasks.tasks,
        samples_per_task=job.samples_per_task,
        environment=build_environment(local),
        workers=list(workers.values()),
        sink=OutputSink(local.output, follow_symlinks=False),
        perf=perf,
        sampling=job.sampling,
        max_turns=job.max_turns,
        policy=policy,
        deadline_s=job.deadline_s,
        malformed_tasks=len(local.tasks.errors),
        config=ctx.session_config,
        metrics=ctx.metrics,
        weights=job.weights,
        weight_versions=runtime.weight_versions,
        max_trajectories_in_flight=in_flight,
    )
    ctx.sessions[key] = session
    started = now_iso()
    running = [
        valid,
        condition("PoolReady", True, "InstancesReady", f"{len(workers)} instances"),
        condition("Running", True, "SessionRunning", _running(job.policy, policy)),
    ]
    await status.write("Running", running, startTime=started)
    task = asyncio.create_task(session.run())
    try:
        loaded: list[dict[str, str]] = []  # the WeightsLoaded condition, once written
        while not task.done():
            if stopped():
                task.cancel()
                break
            await _sync_workers(ctx, job, session, workers)
            if not loaded and (loaded := _weights_loaded(job, session)):
                await status.write("Running", loaded)
            await status.write("Running", force=False, **_progress_fields(session.progress()))
            await asyncio.wait({task}, timeout=ctx.status_interval_s)
        with contextlib.suppress(asyncio.CancelledError):
            result = await task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        ctx.sessions.pop(key, None)
    if stopped() or task.cancelled():
        return
    p = result.progress
    message = f"{p.done} done, {p.failed} failed of {p.total}"
    if result.deadline_hit:
        message += " (deadline reached: unfinished ones recorded as truncated)"
    await status.write(
        "Succeeded",
        [
            *(loaded or _weights_loaded(job, session)),  # a job quicker than a status round
            condition("Running", False, "Finished", message),
            condition("Complete", True, "AllRecorded", message),
        ],
        completionTime=now_iso(),
        **_progress_fields(p),
    )


def _weights_loaded(job: RolloutJobSpec, session: RolloutSession) -> list[dict[str, str]]:
    """``WeightsLoaded`` once the session's first round of loads is over, else nothing."""
    if job.weights is None or not session.weights.ready.is_set():
        return []
    return [condition("WeightsLoaded", True, "CheckpointLoaded",
        f"version {job.weights.version} from {job.weights.path} on "
        f"{sum(v == job.weights.version for v in session.weights.versions.values())} instances",
    )]  # fmt: skip


async def _sync_workers(
    ctx: JobContext, job: RolloutJobSpec, session: RolloutSession, known: dict[str, WorkerEndpoint]
) -> None:
    pool_body = await ctx.kube.get(ENGINEPOOLS, job.namespace, job.engine_pool)
    if pool_body is None:
        return
    ready = _ready_workers(pool_body, await _token(ctx, job))
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
        elif name not in ready and name not in draining:
            session.remove_worker(name)
            known.pop(name)


def _running(asked: str, ran: str) -> str:
    if asked == ran:
        return f"policy {asked}"
    # The shape planner predicted the job's policy would not beat this one on the shape.
    return f"policy {ran} (the shape planner's choice for policy {asked}; docs/scheduler.md)"
