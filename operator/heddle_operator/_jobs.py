"""RolloutJob lifecycle in the operator: validate, queue per pool, keep a session pod.

:func:`run_job` is the body of the job's kopf daemon. The session itself runs
in the job's session pod (:mod:`._session_pod`), which writes the job's
progress and final phase; the operator validates what it can without the
job's files, queues jobs per pool, makes the pod once the job's turn comes
and its pool exists, reports a pod that cannot start (``SessionReady=False``),
and replaces a session pod that ended before the job did (the new session
resumes from the output). Stopping or restarting the operator leaves the
session running.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from heddle.api import JobPhase, PodPolicy, RolloutJobSpec, check_session_policy
from heddle.exceptions import HeddleError, ManifestError
from heddle.rollout import check_tool_hosts

from ._builders import condition, now_iso
from ._job_status import FINISHED, JobStatus
from ._kube import (
    ENGINEPOOLS,
    PODS,
    ROLLOUTJOBS,
    SECRETS,
    SERVICES,
    ApiError,
    KubeClient,
    Resource,
)
from ._kube import ROLEBINDINGS as _ROLEBINDINGS
from ._kube import ROLES as _ROLES
from ._kube import SERVICEACCOUNTS as _SERVICEACCOUNTS
from ._session_builders import (
    LABEL_JOB,
    SessionPodOptions,
    gateway_objects,
    serves_trainer,
    session_account,
    session_pod,
    session_rbac,
    trainer_objects,
)

# A Pod's own final phases (Kubernetes' vocabulary), not a job's.
POD_ENDED = ("Succeeded", "Failed")

__all__ = ["JobContext", "delete_session_pods", "owned_by", "run_job", "session_pods"]

log = logging.getLogger("heddle.operator.jobs")
_RBAC: dict[str, Resource] = {
    "serviceaccounts": _SERVICEACCOUNTS, "roles": _ROLES, "rolebindings": _ROLEBINDINGS,
}  # fmt: skip
# Waiting reasons of a container that will not start without a fix (kubelet's names).
_CANNOT_START = (
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
    "CreateContainerError", "CrashLoopBackOff",
)  # fmt: skip


@dataclass(frozen=True)
class JobContext:
    """What a job's daemon needs from the operator."""

    kube: KubeClient
    pod: SessionPodOptions  # what every session pod gets
    status_interval_s: float = 1.0
    poll_s: float = 1.0
    max_session_restarts: int = 5  # session pods that end early, then the job fails


def _output_key(ctx: JobContext, path: str) -> str:
    """Where an output lands in the session pod, as a comparable string."""
    return os.path.normpath(os.path.join(str(ctx.pod.base_dir), path))


async def _output_holder(ctx: JobContext, body: Mapping[str, Any], output: str) -> str | None:
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
        if _output_key(ctx, path) == _output_key(ctx, output):
            return str(m["name"])
    return None


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


def _validate(body: Mapping[str, Any], ctx: JobContext) -> RolloutJobSpec:
    job = RolloutJobSpec.from_manifest(body)
    check_tool_hosts(job, ctx.pod.tool_hosts)
    check_session_policy(job, ctx.pod.policy or PodPolicy(), session_account(job.name))
    return job


async def run_job(
    ctx: JobContext,
    body: Mapping[str, Any],
    stopped: Callable[[], bool],
    sleep: Callable[[float], Awaitable[Any]],
) -> None:
    status = JobStatus(ctx.kube, body, ctx.status_interval_s)
    if status.phase in FINISHED:
        return
    try:
        job = _validate(body, ctx)
    except HeddleError as exc:
        await status.write(JobPhase.FAILED, [condition("Valid", False, "InvalidSpec", str(exc))])
        return
    holder = await _output_holder(ctx, body, job.output_path)
    if holder is not None:
        await status.write(JobPhase.FAILED, [condition("Valid", False, "OutputInUse",
            f"RolloutJob {holder!r} writes to the same spec.output.path {job.output_path!r}; "
            "give this job its own output path",
        )])  # fmt: skip
        return
    keeper = _PodKeeper(ctx, job, body, status)
    while not stopped():
        current = await ctx.kube.get(ROLLOUTJOBS, job.namespace, job.name)
        if current is None or (current.get("status") or {}).get("phase") in FINISHED:
            return  # the session wrote the end (or the job went)
        if not await keeper.round(current):
            return
        await sleep(ctx.poll_s)


class _PodKeeper:
    """One job's rounds: queue, pool, RBAC, and the session pod's life."""

    def __init__(
        self, ctx: JobContext, job: RolloutJobSpec, body: Mapping[str, Any], status: JobStatus
    ) -> None:
        self.ctx, self.job, self.body, self.status = ctx, job, body, status
        self.uid = body["metadata"].get("uid")
        self.written: tuple[str, ...] = ()  # what this keeper wrote last (no repeats)
        self.rbac_done = job.session.service_account_name is not None
        self.gateway_done = job.environment.type != "external"  # only external jobs serve one
        self.trainer_done = not serves_trainer(job)
        self.created = 0  # session pods this operator made for the job
        self.version: str | None = None  # the job's resourceVersion this round read

    async def _say(self, phase: JobPhase | None, cond: dict[str, str]) -> None:
        """Write ``phase`` and ``cond`` unless written already, and only onto the job as this
        round read it: the session may have written since (409), and wins."""
        key = (str(phase), cond["type"], cond["status"], cond["reason"], cond["message"])
        if key == self.written:
            return
        try:
            await self.status.write(phase, [cond], if_version=self.version)
        except ApiError as exc:
            if exc.status != 409:
                raise
            return  # the next round decides again on what the job is now
        self.written = key

    async def round(self, current: Mapping[str, Any]) -> bool:
        """One round; False when the job is over (failed here)."""
        ctx, job = self.ctx, self.job
        self.version = current["metadata"].get("resourceVersion")
        ahead = await _first_in_queue(ctx, current, job.engine_pool)
        if ahead is not None:
            await self._say(JobPhase.QUEUED, condition(
                "Running", False, "WaitingForPool",
                f"job {ahead!r} runs on pool {job.engine_pool!r} first",
            ))  # fmt: skip
            return True
        if await ctx.kube.get(ENGINEPOOLS, job.namespace, job.engine_pool) is None:
            await self._say(JobPhase.PENDING, condition(
                "PoolReady", False, "PoolNotFound",
                f"EnginePool {job.engine_pool!r} does not exist in namespace {job.namespace}; "
                "create it or fix spec.enginePool",
            ))  # fmt: skip
            return True
        try:
            if not self.rbac_done:
                await self._ensure_rbac()
            if not self.gateway_done:
                await self._ensure_gateway()
            if not self.trainer_done:
                await self._ensure_trainer()
        except ManifestError as exc:  # an object of that name that is not the job's
            await self.status.write(JobPhase.FAILED,
                                    [condition("Valid", False, "NameTaken", str(exc))],
                                    completionTime=now_iso())  # fmt: skip
            return False
        pods = [p for p in await session_pods(ctx.kube, job.namespace, job.name)
                if owned_by(p, self.uid)]  # fmt: skip
        if any(p["metadata"].get("deletionTimestamp") for p in pods):
            return True  # the old session goes first: never two sessions on one output
        live = [p for p in pods if (p.get("status") or {}).get("phase") not in POD_ENDED]
        for pod in pods:
            if pod not in live:
                name = pod["metadata"]["name"]
                log.info("RolloutJob %s/%s: session pod %s ended before the job; replacing it",
                         job.namespace, job.name, name)  # fmt: skip
                await _delete(ctx.kube, job.namespace, name)
        if len(live) < len(pods):
            return True  # created in a later round, once the ended one is gone
        # Before the session writes its own phase, the job waits for its pod: Pending.
        phase = (
            JobPhase.PENDING
            if (current.get("status") or {}).get("phase") in (None, JobPhase.QUEUED)
            else None
        )
        if not live:
            return await self._create(phase)
        pod = live[0]
        name = pod["metadata"]["name"]
        stuck = _cannot_start(pod)
        if stuck is not None:
            await self._say(phase, condition("SessionReady", False, "SessionCannotStart",
                f"session pod {name} cannot start: {stuck}; fix spec.session "
                f"(kubectl describe pod {name} shows the same)",
            ))  # fmt: skip
        elif (pod.get("status") or {}).get("phase") == "Running":
            await self._say(None, condition("SessionReady", True, "SessionPodRunning",
                                            f"session pod {name} runs the session"))  # fmt: skip
        return True

    async def _create(self, phase: JobPhase | None) -> bool:
        ctx, job = self.ctx, self.job
        if self.created > ctx.max_session_restarts:
            await self.status.write(JobPhase.FAILED, [condition("Complete", False, "SessionFailed",
                f"the session pod ended before the job {self.created} times; its log says why",
            )], completionTime=now_iso())  # fmt: skip
            return False
        created = await ctx.kube.create(PODS, job.namespace, session_pod(job, self.body, ctx.pod))
        self.created += 1
        name = created["metadata"]["name"] if isinstance(created, Mapping) else "?"
        await self._say(phase, condition("SessionReady", False, "SessionPodStarting",
                                        f"session pod {name} is starting"))  # fmt: skip
        return True

    async def _ensure_gateway(self) -> None:
        """An external job's token Secret and Service (an existing Secret of the job's is
        kept: its token is the one agents hold)."""
        token = secrets.token_urlsafe(32)
        for plural, obj in gateway_objects(self.job, self.body, token):
            await self._ensure_own(SECRETS if plural == "secrets" else SERVICES, obj)
        self.gateway_done = True

    async def _ensure_trainer(self) -> None:
        """The trainer API's token Secret and Service (an existing Secret of the job's is
        kept: a trainer may hold its token already); the session publishes the URL."""
        token = secrets.token_urlsafe(32)
        for plural, obj in trainer_objects(self.job, self.body, token):
            await self._ensure_own(SECRETS if plural == "secrets" else SERVICES, obj)
        self.trainer_done = True

    async def _ensure_rbac(self) -> None:
        for plural, obj in session_rbac(self.job, self.body):
            await self._ensure_own(_RBAC[plural], obj)
        self.rbac_done = True

    async def _ensure_own(self, resource: Resource, obj: Mapping[str, Any]) -> None:
        """Create ``obj``; one that exists already is used only if this job owns it: a
        Service, Secret or Role someone else made under the job's name would route its
        agents, hold its token or grant its session other rights."""
        name = obj["metadata"]["name"]
        existing = await self.ctx.kube.get(resource, self.job.namespace, name)
        if existing is None:
            try:
                await self.ctx.kube.create(resource, self.job.namespace, obj)
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
                existing = await self.ctx.kube.get(resource, self.job.namespace, name)
        if existing is not None and not owned_by(existing, self.uid):
            kind = obj["kind"]
            raise ManifestError(
                f"a {kind} named {name!r} already exists in namespace {self.job.namespace} and "
                f"is not this job's (no owner reference to it); the operator does not reuse "
                f"objects it did not make: delete that {kind} or rename the job"
            )


def owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether ``obj``'s controller is the object with ``uid`` (what this operator made for
    it); an object without a uid owns nothing."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return uid is not None and any(r.get("uid") == uid and r.get("controller") for r in refs)


def _cannot_start(pod: Mapping[str, Any]) -> str | None:
    """Why the session pod cannot start, as the kubelet or scheduler said, or None."""
    status = pod.get("status") or {}
    for c in status.get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _CANNOT_START:
            return f"{waiting.get('message') or 'no message'} ({waiting['reason']})"
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"{c.get('message') or 'not scheduled'} ({c.get('reason') or 'Unschedulable'})"
    return None


async def session_pods(kube: KubeClient, namespace: str, job: str) -> list[dict[str, Any]]:
    return await kube.list(PODS, namespace, {LABEL_JOB: job})


async def _delete(kube: KubeClient, namespace: str, name: str) -> None:
    try:
        await kube.delete(PODS, namespace, name)
    except ApiError as exc:
        if exc.status != 404:
            raise


async def delete_session_pods(
    kube: KubeClient, namespace: str, job: str, uid: str | None
) -> Sequence[str]:
    """Delete the job's session pods (on the job's deletion; owner references do it too,
    where a garbage collector runs); a pod that only carries the job's label is not the
    operator's and stays."""
    names = [
        p["metadata"]["name"] for p in await session_pods(kube, namespace, job) if owned_by(p, uid)
    ]
    for name in names:
        await _delete(kube, namespace, name)
    return names
