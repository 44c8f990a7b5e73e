"""The names every part of Heddle agrees on: API group, version, kinds, labels, phases.

Written once here; the CRDs in ``crds/`` spell the same strings (a test reads
them back), and the operator, the session and the trainer's client import them.
Phases are ``StrEnum``: they compare equal to the strings the API server stores.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ANNOTATION_DRAINING",
    "ANNOTATION_DRAINING_SINCE",
    "ANNOTATION_SPEC_HASH",
    "API_VERSION",
    "ENGINEPOOL_KIND",
    "ENGINEPOOL_PLURAL",
    "FINALIZER",
    "GROUP",
    "LABEL_JOB",
    "LABEL_POOL",
    "LABEL_TP",
    "ROLLOUTJOB_KIND",
    "ROLLOUTJOB_PLURAL",
    "VERSION",
    "InstancePhase",
    "JobPhase",
]

GROUP = "heddle.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

ENGINEPOOL_KIND, ENGINEPOOL_PLURAL = "EnginePool", "enginepools"
ROLLOUTJOB_KIND, ROLLOUTJOB_PLURAL = "RolloutJob", "rolloutjobs"

# On worker pods (and the pool's Service selector).
LABEL_POOL = f"{GROUP}/pool"
LABEL_TP = f"{GROUP}/tp"
# On a job's session pod and its gateway Service.
LABEL_JOB = f"{GROUP}/job"
# On worker pods: the spec they were built from, and the drain the operator started.
ANNOTATION_SPEC_HASH = f"{GROUP}/spec-hash"
ANNOTATION_DRAINING = f"{GROUP}/draining"
ANNOTATION_DRAINING_SINCE = f"{GROUP}/draining-since"
FINALIZER = f"{GROUP}/finalizer"


class JobPhase(StrEnum):
    """``RolloutJob.status.phase`` (docs/resources.md)."""

    PENDING = "Pending"  # accepted, waiting for its pool to be Ready
    QUEUED = "Queued"  # another job holds the pool
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED)


class InstancePhase(StrEnum):
    """``EnginePool.status.instances[].phase``: one engine instance's pod as the pool sees it."""

    PENDING = "Pending"  # scheduled or not, its container not running
    STARTING = "Starting"  # running, not yet ready (loading weights)
    READY = "Ready"
    DRAINING = "Draining"  # taking no new trajectories before it is removed
    FAILED = "Failed"
