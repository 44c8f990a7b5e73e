"""EnginePool reconciliation: pods for the shape, drains, replacements, status.

One call of :func:`reconcile_pool` is one round: read the pods, decide with
:func:`pool_actions`, apply, write status if it changed. The kopf daemon of
each pool calls it about once a second (``OperatorConfig.reconcile_interval_s``)
with the pool's pods from the operator's kopf index (a watch, not a LIST per
round); the round's own writes are laid over that view until the watch has
delivered them (:class:`OwnWrites`), so a lagging watch never makes a round
create, drain or delete the same pod twice.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from heddle.api import (
    ANNOTATION_DRAINING,
    ANNOTATION_DRAINING_SINCE,
    ANNOTATION_SPEC_HASH,
    EnginePoolSpec,
    InstancePhase,
    PodPolicy,
    check_pool_policy,
)
from heddle.exceptions import ManifestError
from heddle.scheduler import PoolShape

from ._builders import (
    LABEL_POOL,
    LABEL_TP,
    WORKER_PORT,
    condition,
    headless_service,
    merge_conditions,
    now_iso,
    pod_phase,
    shape_entries,
    spec_hash,
    worker_network_policy,
    worker_pod,
)
from ._kube import ENGINEPOOLS, NETWORKPOLICIES, PODS, SERVICES, ApiError, KubeClient
from ._reconcile import PodView, pool_actions
from ._tokens import TokenState, ensure_worker_token, token_digest

__all__ = ["OwnWrites", "PoolRuntime", "baseline_shape", "reconcile_pool"]

log = logging.getLogger("heddle.operator.pools")
SERVICE_CHECK_S = 60.0  # how often a round re-reads the headless Service and the token Secret


@dataclass
class OwnWrites:
    """Pods this operator wrote that the index may not show yet, by name.

    Each entry holds the resourceVersion the pod had before the write (None: it
    did not exist) and the object after it (None: deleted). Once the index shows
    another version, the watch has caught up and the entry goes; ``wait_s`` bounds
    how long an entry may stand in for the watch.
    """

    wait_s: float = 10.0
    entries: dict[str, tuple[str | None, dict[str, Any] | None, float]] = field(
        default_factory=dict
    )

    def note(self, before: Mapping[str, Any] | None, after: Any, name: str) -> None:
        rv = (before or {}).get("metadata", {}).get("resourceVersion")
        kept = dict(after) if isinstance(after, Mapping) and after.get("metadata") else None
        self.entries[name] = (rv, kept, time.monotonic() + self.wait_s)

    def over(self, pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """``pods`` (the index's view) with this operator's newer writes laid over it."""
        by_name = {p["metadata"]["name"]: p for p in pods}
        now = time.monotonic()
        for name, (before, after, until) in list(self.entries.items()):
            seen = by_name.get(name)
            if now > until or (seen or {}).get("metadata", {}).get("resourceVersion") != before:
                del self.entries[name]  # the watch delivered it (or something newer)
            elif after is None:  # deleted: terminating until the watch says it is gone
                if seen is not None:
                    meta = {**seen["metadata"], "deletionTimestamp": now_iso()}
                    by_name[name] = {**seen, "metadata": meta}
            else:
                by_name[name] = after
        return sorted(by_name.values(), key=lambda p: str(p["metadata"]["name"]))


@dataclass
class PoolRuntime:
    """What the operator remembers about a pool between rounds (lost on restart: fine)."""

    planned: PoolShape | None = None  # the running job's planned shape (its status.plannedShape)
    last_status: dict[str, Any] = field(default_factory=dict)
    reshapes: int = 0
    weight_versions: dict[str, str] = field(default_factory=dict)  # instance -> version (jobs)
    writes: OwnWrites = field(default_factory=OwnWrites)
    service_check_at: float = 0.0  # monotonic time of the next check of the headless Service
    token: TokenState | None = None  # the pool's worker token as last read
    token_check_at: float = 0.0  # monotonic time it is read again
    foreign: set[str] = field(default_factory=set)  # pods with the pool's label, not its own
    # The running job's start-up decisions (its status.decisions), kept first in the
    # pool's status for the next job; None: nothing new (a merge patch keeps the old).
    decisions: dict[str, Any] | None = None


def baseline_shape(pool: EnginePoolSpec) -> PoolShape:
    tp = min(pool.tensor_parallel_sizes)
    return PoolShape.of({tp: pool.gpus // tp})


def desired_shape(pool: EnginePoolSpec, runtime: PoolRuntime) -> tuple[PoolShape, str]:
    if pool.shape is not None:
        return pool.shape, "pinned"
    planned = runtime.planned
    if (
        planned is not None
        and planned.gpus <= pool.gpus
        and all(tp in pool.tensor_parallel_sizes for tp, _ in planned.counts)
    ):  # what a session published: only a shape the pool's spec allows
        return planned, "planned"
    return baseline_shape(pool), "baseline"


def _views(pods: Sequence[Mapping[str, Any]], current_hash: str) -> list[PodView]:
    views = []
    for pod in pods:
        meta = pod.get("metadata", {})
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        views.append(
            PodView(
                name=meta["name"],
                tp=int(labels.get(LABEL_TP, "1")),
                phase=pod_phase(pod),
                terminating=bool(meta.get("deletionTimestamp")),
                draining=annotations.get(ANNOTATION_DRAINING) == "true",
                outdated=annotations.get(ANNOTATION_SPEC_HASH) != current_hash,
            )
        )
    return views


def _own_pods(
    body: Mapping[str, Any], runtime: PoolRuntime, pods: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The pods this pool's controller reference marks as its own. A pod that only carries
    the pool's label is not an instance: never drained, deleted, counted or routed to
    (its address would receive prompts and the pool's token); it is reported once."""
    uid = body["metadata"].get("uid")
    own = []
    for pod in pods:
        refs = pod.get("metadata", {}).get("ownerReferences") or []
        if uid is not None and any(r.get("uid") == uid and r.get("controller") for r in refs):
            own.append(pod)
            continue
        name = pod["metadata"]["name"]
        if name not in runtime.foreign:
            runtime.foreign.add(name)
            meta = body["metadata"]
            log.warning(
                "EnginePool %s/%s: pod %s carries the pool's label but the pool does not own "
                "it; ignored", meta.get("namespace", "default"), meta["name"], name,
            )  # fmt: skip
            _event(body, "ForeignPodIgnored",
                   f"pod {name} carries label {LABEL_POOL}={meta['name']} but was not made by "
                   "the operator for this pool; it is not an instance and gets no traffic",
                   kind="Warning")  # fmt: skip
    return own


def endpoint(pod: Mapping[str, Any]) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    return f"http://{ip}:{WORKER_PORT}" if ip else None


DECISIONS_KEPT = 4  # records in a pool's status.decisions: the latest jobs' distinct keys


def kept_decisions(body: Mapping[str, Any], latest: dict[str, Any]) -> list[dict[str, Any]]:
    """The pool's status.decisions with ``latest`` first: one record per key, the most
    recent :data:`DECISIONS_KEPT` (a job whose prompts straddle two keys finds both)."""
    earlier = (body.get("status") or {}).get("decisions")
    others = [
        dict(r) for r in (earlier if isinstance(earlier, list) else [])
        if isinstance(r, Mapping) and r.get("key") != latest.get("key")
    ]  # fmt: skip
    return [latest, *others][:DECISIONS_KEPT]


async def reconcile_pool(
    kube: KubeClient,
    body: Mapping[str, Any],
    runtime: PoolRuntime,
    *,
    resident: Mapping[str, int],
    drain_timeout_s: float,
    pods: Sequence[Mapping[str, Any]] | None = None,
    policy: PodPolicy | None = None,
) -> None:
    """One round. ``resident`` counts unfinished trajectories per instance (the job's session);
    ``pods`` are the pool's pods as the operator's index has them (None: LIST them);
    ``policy`` is what the pool's pods may ask for (the operator's settings)."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta.get("namespace", "default")
    status = dict(body.get("status") or {})
    try:
        pool = EnginePoolSpec.from_manifest(body)
        check_pool_policy(pool, policy or PodPolicy())
    except ManifestError as exc:
        await _patch_status(
            kube, body, runtime, {"conditions": merge_conditions(
                status.get("conditions", []),
                [condition("Degraded", True, "InvalidSpec", str(exc)),
                 condition("Ready", False, "InvalidSpec", "fix the spec (see Degraded)")],
                generation=meta.get("generation"),
            ), "observedGeneration": meta.get("generation")},
        )  # fmt: skip
        return
    desired, source = desired_shape(pool, runtime)
    token = runtime.token
    if token is None or token.token is None or time.monotonic() >= runtime.token_check_at:
        # Read again once a minute (a deleted Secret, i.e. a new token, is seen within
        # that), every round while it is missing: an idle pool costs no request.
        token = runtime.token = await ensure_worker_token(kube, body)
        runtime.token_check_at = time.monotonic() + SERVICE_CHECK_S
    digest = token_digest(token.token)
    if pods is None:
        pods = await kube.list(PODS, namespace, {LABEL_POOL: name})
    pods = _own_pods(body, runtime, runtime.writes.over(pods))
    by_name = {p["metadata"]["name"]: p for p in pods}
    views = _views(pods, spec_hash(pool, digest))
    now = time.time()
    drained = set()
    for pod, view in zip(pods, views, strict=True):
        if not view.draining:
            continue
        since = float(
            (pod["metadata"].get("annotations") or {}).get(ANNOTATION_DRAINING_SINCE, now)
        )
        left = resident.get(view.name, 0)
        if left == 0 or now - since > drain_timeout_s:
            drained.add(view.name)
            log.info(
                "EnginePool %s/%s: %s %s", namespace, name, view.name,
                f"drain timed out with {left} trajectories on it" if left else "is empty",
            )  # fmt: skip
    actions = pool_actions(name, views, desired, pool.gpus, drained)
    for note in actions.notes:
        log.info("EnginePool %s/%s: %s", namespace, name, note)
    writes = runtime.writes
    for pod_name in actions.drain:
        after = await kube.patch(
            PODS, namespace, pod_name,
            {"metadata": {"annotations": {
                ANNOTATION_DRAINING: "true", ANNOTATION_DRAINING_SINCE: str(now),
            }}},
        )  # fmt: skip
        writes.note(by_name.get(pod_name), after, pod_name)
        _event(body, "Draining", f"draining {pod_name} before removing it")
    for pod_name in actions.delete:
        await kube.delete(PODS, namespace, pod_name)
        writes.note(by_name.get(pod_name), None, pod_name)
        _event(body, "Deleted", f"deleted instance {pod_name}")
    # No instance without the pool's own token: a pod would read whatever Secret holds its
    # name (the Degraded condition says why).
    for pod_name, tp in actions.create if token.token is not None else ():
        try:
            created = await kube.create(
                PODS, namespace, worker_pod(pool, body, pod_name, tp, digest, policy)
            )
        except ApiError as exc:
            if exc.status != 409:
                raise
            continue  # it exists: the index shows it soon; no second "Created" event
        writes.note(None, created, pod_name)
        _event(body, "Created", f"created instance {pod_name} (TP{tp})")
    if actions.drain or actions.create:
        runtime.reshapes += 1
    if time.monotonic() >= runtime.service_check_at:
        # Checked once a minute, not every round: the Service rarely goes (and a recreated
        # one only restores DNS names; endpoints in status do not depend on it).
        for resource, obj in (
            (SERVICES, headless_service(pool, body)),
            (NETWORKPOLICIES, worker_network_policy(pool, body)),
        ):
            if await kube.get(resource, namespace, obj["metadata"]["name"]) is None:
                try:
                    await kube.create(resource, namespace, obj)
                except ApiError as exc:
                    if exc.status != 409:
                        raise
        runtime.service_check_at = time.monotonic() + SERVICE_CHECK_S
    await _write_status(
        kube, body, runtime, pool, desired, source, pods, views, actions.blocked_gpus,
        token.problem,
    )  # fmt: skip


async def _write_status(
    kube: KubeClient,
    body: Mapping[str, Any],
    runtime: PoolRuntime,
    pool: EnginePoolSpec,
    desired: PoolShape,
    source: str,
    pods: Sequence[Mapping[str, Any]],
    views: list[PodView],
    blocked_gpus: int,
    token_problem: str | None = None,
) -> None:
    ready = PoolShape.of(Counter(v.tp for v in views if v.phase == InstancePhase.READY))
    versions = runtime.weight_versions  # what sessions loaded (RolloutJob spec.weights)
    for gone in set(versions) - {v.name for v in views}:
        del versions[gone]
    instances = [
        {"name": v.name, "tp": v.tp, "endpoint": endpoint(p) or "", "phase": v.phase}
        | ({"weightVersion": versions[v.name]} if v.name in versions else {})
        for p, v in sorted(zip(pods, views, strict=True), key=lambda pv: pv[1].name)
    ]
    active = Counter(v.tp for v in views if v.active)
    complete = all(active.get(tp, 0) == n for tp, n in desired.counts) and sum(active.values()) == (
        desired.num_instances
    )
    all_ready = ready == desired and complete
    draining = [v.name for v in views if v.draining or v.terminating]
    failed = [v.name for v in views if v.phase == InstancePhase.FAILED]
    stuck = [f"{v.name}: {why}" for p, v in zip(pods, views, strict=True) if (why := _stuck(p))]
    reshaping = not complete or bool(draining)
    updates = [
        condition(
            "Ready",
            all_ready,
            "AllInstancesReady" if all_ready else "InstancesNotReady",
            f"{sum(c for _, c in ready.counts)}/{desired.num_instances} instances ready",
        ),
        condition(
            "Reshaping",
            reshaping,
            "ShapeChanging" if reshaping else "ShapeReached",
            f"towards {desired} ({source}); draining {draining}" if reshaping else str(desired),
        ),
        _degraded(pool, failed, stuck, blocked_gpus, bool(draining), token_problem),
    ]
    status = {
        "observedGeneration": body["metadata"].get("generation"),
        "shape": {
            "desired": shape_entries(desired),
            "ready": shape_entries(ready),
            "summary": str(desired),
            "readySummary": f"{sum(c for _, c in ready.counts)}/{desired.num_instances}",
            "source": source,
        },
        "instances": instances,
    }
    if runtime.decisions is not None:
        status["decisions"] = kept_decisions(body, runtime.decisions)
    comparable = {**status, "conditions": [(c["type"], c["status"], c["message"]) for c in updates]}
    # The kept decisions are compared with what the status holds now, not with what the
    # operator last wrote: a record put there by someone else is replaced all the same.
    current_decisions = (body.get("status") or {}).get("decisions")
    if comparable == runtime.last_status and status.get("decisions", current_decisions) == (
        current_decisions
    ):
        return
    current = (body.get("status") or {}).get("conditions", [])
    status["conditions"] = merge_conditions(
        current, updates, generation=body["metadata"].get("generation")
    )
    await _patch_status(kube, body, runtime, status)
    runtime.last_status = comparable


# Waiting reasons of a container that cannot start until someone fixes its config
# (kubelet's names): the instance would sit in Pending without a word otherwise.
_CONFIG_ERRORS = ("CreateContainerConfigError", "CreateContainerError", "InvalidImageName")


def _stuck(pod: Mapping[str, Any]) -> str | None:
    """Why a pod's worker container cannot start, as the kubelet reported it, or None."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _CONFIG_ERRORS:
            return f"{waiting.get('message') or 'no message'} ({waiting['reason']})"
    return None


def _degraded(
    pool: EnginePoolSpec,
    failed: list[str],
    stuck: list[str],
    blocked_gpus: int,
    draining: bool,
    token_problem: str | None,
) -> dict[str, str]:
    cannot_start = (
        f"instances cannot start: {'; '.join(stuck)}; fix what the kubelet names "
        "(kubectl describe pod shows the same)"
    )
    if token_problem is not None:
        message = f"{token_problem}; {cannot_start}" if stuck else token_problem
        return condition("Degraded", True, "WorkerTokenMissing", message)
    if stuck:
        return condition("Degraded", True, "InstanceCannotStart", cannot_start)
    if failed:
        return condition(
            "Degraded", True, "InstanceFailed", f"failed instances {failed} are being replaced"
        )
    if blocked_gpus > 0 and not draining:
        budget = f"{blocked_gpus} GPUs of the shape do not fit the budget {pool.gpus}"
        return condition("Degraded", True, "OverBudget", budget)
    return condition("Degraded", False, "Healthy", "no failed instances")


def _event(body: Mapping[str, Any], reason: str, message: str, kind: str = "Normal") -> None:
    """An Event on the pool through kopf's poster: queued, never blocking a round; kopf posts
    it with its own credentials and retries."""
    obj = body if isinstance(body, kopf.Body) else kopf.Body(cast(kopf.RawBody, dict(body)))
    kopf.event(obj, type=kind, reason=reason, message=message)


async def _patch_status(
    kube: KubeClient, body: Mapping[str, Any], runtime: PoolRuntime, status: dict[str, Any]
) -> None:
    meta = body["metadata"]
    await kube.patch(
        ENGINEPOOLS, meta.get("namespace", "default"), meta["name"], {"status": status}, status=True
    )
