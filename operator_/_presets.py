"""Load workload and cluster descriptions by preset name or file path."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from heddle.exceptions import WorkloadError
from heddle.scheduler import ClusterSpec, WorkloadSpec

__all__ = ["WORKLOAD_PRESETS", "load_cluster", "load_workload"]

WORKLOAD_PRESETS = ("coding", "search", "math", "flat", "quickstart")
CLUSTER_PRESETS = {"64xh100": "cluster-64xh100.yaml"}


def _read(name_or_path: str, presets: dict[str, str], kind: str) -> tuple[Any, str]:
    path = Path(name_or_path)
    if name_or_path in presets:
        text = resources.files("heddle.scheduler").joinpath("presets", presets[name_or_path])
        return yaml.safe_load(text.read_text(encoding="utf-8")), f"preset {name_or_path!r}"
    if not path.is_file():
        raise WorkloadError(
            f"{kind} {name_or_path!r} is neither a preset ({', '.join(sorted(presets))}) "
            "nor a readable file"
        )
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")), str(path)
    except yaml.YAMLError as exc:
        raise WorkloadError(f"{path}: not valid YAML: {exc}") from exc


def load_workload(name_or_path: str) -> WorkloadSpec:
    """A workload preset (``coding``, ``search``, ``math``, ``flat``) or a YAML file."""
    data, source = _read(name_or_path, {w: f"{w}.yaml" for w in WORKLOAD_PRESETS}, "workload")
    return WorkloadSpec.from_dict(data, source)


def load_cluster(name_or_path: str) -> ClusterSpec:
    """A cluster preset (``64xh100``) or a YAML file."""
    data, source = _read(name_or_path, CLUSTER_PRESETS, "cluster")
    return ClusterSpec.from_dict(data, source)
