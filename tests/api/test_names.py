"""The names in ``heddle.api`` are the ones the CRDs declare: one fact, checked in both places."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from heddle.api import (
    ENGINEPOOL_KIND,
    ENGINEPOOL_PLURAL,
    GROUP,
    ROLLOUTJOB_KIND,
    ROLLOUTJOB_PLURAL,
    VERSION,
    InstancePhase,
    JobPhase,
)

CRDS = Path(__file__).resolve().parents[2] / "crds"


def _crd(plural: str) -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load((CRDS / f"{plural}.{GROUP}.yaml").read_text())
    return crd


def _status_schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == VERSION]
    status: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return status


def test_group_version_kinds_and_plurals_match_the_crds() -> None:
    for plural, kind in (
        (ENGINEPOOL_PLURAL, ENGINEPOOL_KIND),
        (ROLLOUTJOB_PLURAL, ROLLOUTJOB_KIND),
    ):
        crd = _crd(plural)
        assert crd["spec"]["group"] == GROUP
        assert crd["spec"]["names"]["plural"] == plural
        assert crd["spec"]["names"]["kind"] == kind
        assert [v["name"] for v in crd["spec"]["versions"] if v.get("storage")] == [VERSION]


def test_job_phases_are_the_crd_enum() -> None:
    phase = _status_schema(_crd(ROLLOUTJOB_PLURAL))["properties"]["phase"]
    assert phase["enum"] == [p.value for p in JobPhase]


def test_instance_phases_are_the_crd_enum() -> None:
    instances = _status_schema(_crd(ENGINEPOOL_PLURAL))["properties"]["instances"]
    assert instances["items"]["properties"]["phase"]["enum"] == [p.value for p in InstancePhase]


def test_phases_compare_equal_to_the_strings_the_api_server_stores() -> None:
    assert JobPhase("Succeeded") == "Succeeded"
    assert JobPhase.SUCCEEDED.finished and JobPhase.FAILED.finished
    assert not any(p.finished for p in (JobPhase.PENDING, JobPhase.QUEUED, JobPhase.RUNNING))
