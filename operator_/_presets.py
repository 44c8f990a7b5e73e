"""Load workload and cluster descriptions by preset name or file path."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from heddle.exceptions import WorkloadError
from heddle.scheduler import ClusterSpec, WorkloadSpec

from ._yaml import read_text, safe_load_all

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
    content = read_text(path, f"{kind} file", f"fix the {kind} path", WorkloadError)
    docs = safe_load_all(content, f"{kind} file {path}", WorkloadError)
    if len(docs) != 1:
        raise WorkloadError(f"{kind} file {path} holds {len(docs)} YAML documents; give one")
    return docs[0], str(path)


def load_workload(name_or_path: str) -> WorkloadSpec:
    """A workload preset (``coding``, ``search``, ``math``, ``flat``) or a YAML file."""
    data, source = _read(name_or_path, {w: f"{w}.yaml" for w in WORKLOAD_PRESETS}, "workload")
    return WorkloadSpec.from_dict(data, source)


def load_cluster(name_or_path: str) -> ClusterSpec:
    """A cluster preset (``64xh100``) or a YAML file."""
    data, source = _read(name_or_path, CLUSTER_PRESETS, "cluster")
    return ClusterSpec.from_dict(data, source)
