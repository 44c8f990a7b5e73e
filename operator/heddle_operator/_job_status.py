"""A RolloutJob's status, written by two parties: the operator and the job's session pod.

The operator writes the phases before a session runs (Queued, Pending for a
missing pool, Failed for an invalid spec) and ``SessionReady``; the session
pod writes the rest (Running, progress, Succeeded or Failed). ``conditions``
is a list, which a merge patch replaces whole, so each write reads the
current conditions first and merges its own into them by type: neither
party drops the other's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from heddle.api import JobPhase
from heddle.rollout import Progress

from ._builders import condition, merge_conditions
from ._kube import ROLLOUTJOBS, KubeClient

__all__ = ["FINISHED", "JobStatus", "progress_fields"]

FINISHED = tuple(p for p in JobPhase if p.finished)  # (Succeeded, Failed)


class JobStatus:
    """Status patches of one job, at most one per ``interval_s`` unless forced."""

    def __init__(self, kube: KubeClient, body: Mapping[str, Any], interval_s: float) -> None:
        self.kube = kube
        self.interval_s = interval_s
        meta = body["metadata"]
        self.namespace, self.name = meta.get("namespace", "default"), meta["name"]
        self.generation = meta.get("generation")
        status = body.get("status") or {}
        self.last = 0.0
        raw = status.get("phase")
        self.phase: JobPhase | None = JobPhase(raw) if raw in set(JobPhase) else None
        self.conditions: list[dict[str, Any]] = list(status.get("conditions", []))

    async def write(
        self,
        phase: JobPhase | None,
        conditions: Sequence[Mapping[str, Any]] = (),
        force: bool = True,
        if_version: str | None = None,
        **fields: Any,
    ) -> None:
        """Patch ``phase`` (None: leave it), ``conditions`` (merged by type) and ``fields``.

        ``if_version``: only if the job is still at that resourceVersion (else the API
        server answers 409): a decision taken on what the job was never overwrites what
        the other writer has written since (the session's final phase, say).
        """
        now = time.monotonic()
        if not force and phase == self.phase and now - self.last < self.interval_s:
            return
        if phase is JobPhase.FAILED and conditions:
            # `kubectl wait --for=condition=Failed` as for a batch Job: the cause, again.
            cause = conditions[-1]
            conditions = [
                *conditions,
                condition("Failed", True, str(cause["reason"]), str(cause["message"])),
            ]
        status: dict[str, Any] = dict(fields)
        if conditions:
            current = await self.kube.get(ROLLOUTJOBS, self.namespace, self.name)
            if current is not None:
                self.conditions = list((current.get("status") or {}).get("conditions", []))
            self.conditions = merge_conditions(
                self.conditions, conditions, generation=self.generation
            )
            status["conditions"] = self.conditions
        if phase is not None:
            status["phase"] = phase
            status["observedGeneration"] = self.generation
        patch: dict[str, Any] = {"status": status}
        if if_version is not None:
            patch["metadata"] = {"resourceVersion": if_version}
        await self.kube.patch(ROLLOUTJOBS, self.namespace, self.name, patch, status=True)
        self.last = now
        if phase is not None:
            self.phase = phase


def progress_fields(p: Progress) -> dict[str, Any]:
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
