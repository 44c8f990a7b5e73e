"""What a job's session pod publishes in the RolloutJob's status for the operator, typed.

The session pod writes it (:func:`heddle.operator._session_pod.run_session_pod`)
and the operator's pool daemon reads it back from its index of jobs; both go
through :class:`SessionPublished`, so a field's name and form are written once
(docs/resources.md lists the fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from heddle.scheduler import PoolShape

from ._builders import shape_entries

__all__ = ["SessionPublished"]


@dataclass(frozen=True)
class SessionPublished:
    """The status fields a session publishes; ``None``: not part of this write."""

    planned_shape: PoolShape | None = None  # the shape its planner chose (plannedShape)
    resident: Mapping[str, int] | None = None  # unfinished trajectories per instance
    drained: tuple[str, ...] | None = None  # draining instances it emptied and stopped using
    weight_versions: Mapping[str, str] | None = None  # the checkpoint each instance loaded
    replans: int | None = None  # placement re-plans so far (spec.scheduling.replanInterval...)
    # Its start-up decisions as kept (DecidedRun.as_dict; the pool's status.decisions).
    decisions: Mapping[str, Any] | None = None

    def fields(self) -> dict[str, Any]:
        """The status fields, by their names in the CRD."""
        out: dict[str, Any] = {}
        if self.planned_shape is not None:
            out["plannedShape"] = shape_entries(self.planned_shape)
        if self.resident is not None:
            out["resident"] = dict(self.resident)
        if self.drained is not None:
            out["drained"] = list(self.drained)
        if self.weight_versions is not None:
            out["weightVersions"] = dict(self.weight_versions)
        if self.replans is not None:
            out["replans"] = self.replans
        if self.decisions is not None:
            out["decisions"] = dict(self.decisions)
        return out

    @classmethod
    def of_status(cls, status: Mapping[str, Any]) -> SessionPublished:
        """Read back from a job's status (fields it lacks stay ``None``)."""
        entries = status.get("plannedShape")
        resident = status.get("resident")
        drained = status.get("drained")
        versions = status.get("weightVersions")
        replans = status.get("replans")
        decisions = status.get("decisions")
        return cls(
            planned_shape=(
                PoolShape.of({int(e["tp"]): int(e["replicas"]) for e in entries})
                if entries
                else None
            ),
            resident=(
                {str(k): int(v) for k, v in resident.items()} if resident is not None else None
            ),
            drained=tuple(str(n) for n in drained) if drained is not None else None,
            weight_versions=(
                {str(k): str(v) for k, v in versions.items()} if versions is not None else None
            ),
            replans=int(replans) if replans is not None else None,
            # Passed on as written: the session that reads it back checks it (read_decided).
            decisions=dict(decisions) if isinstance(decisions, Mapping) else None,
        )
