"""Load workload and cluster descriptions by preset name or file path."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from heddle.api import read_text, safe_load_all
from heddle.exceptions import ConfigError, WorkloadError
from heddle.scheduler import (
    BenchWorkload,
    ClusterSpec,
    WorkloadSpec,
    scripts_from_trace,
    synthetic_bench,
    trace_bench,
)

__all__ = ["WORKLOAD_PRESETS", "load_bench_workload", "load_cluster", "load_workload"]

WORKLOAD_PRESETS = (
    "coding",
    "search",
    "math",
    "flat",
    "pareto",
    "bimodal",
    "swe",
    "quickstart",
    "fidelity",
    "engines-tail",
)
CLUSTER_PRESETS = {"64xh100": "cluster-64xh100.yaml", "2xcpu-tiny": "cluster-2xcpu-tiny.yaml"}


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
    # A profile path in a cluster file is relative to that file.
    base = None if name_or_path in CLUSTER_PRESETS else Path(name_or_path).parent
    return ClusterSpec.from_dict(data, source, base)


def _trace_rows(path: Path) -> list[tuple[str, Any]]:
    """(``file line N``, parsed JSON) per non-empty line; lines split on ``\\n`` only."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WorkloadError(f"trace {path}: cannot be read ({exc.strerror})") from exc
    rows: list[tuple[str, Any]] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{path} line {number}"
        try:
            rows.append((where, json.loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"))))
        except UnicodeDecodeError:
            raise WorkloadError(f"{where}: not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            raise WorkloadError(
                f"{where}: not valid JSON ({exc.msg} at column {exc.colno})"
            ) from None
    return rows


def load_bench_workload(name_or_path: str, seed: int, prompts: int | None = None) -> BenchWorkload:
    """A preset or workload YAML (drawn with ``seed``), or a ``.jsonl`` trace replayed as is.

    A trace is a file of trajectory rows or a Heddle output file (docs/workloads.md).
    """
    path = Path(name_or_path)
    if name_or_path not in WORKLOAD_PRESETS and path.suffix == ".jsonl":
        if prompts is not None:
            raise ConfigError(
                f"--prompts {prompts}: a trace replays the trajectories it holds; "
                "drop --prompts, or cut the file"
            )
        return trace_bench(path.stem, scripts_from_trace(_trace_rows(path)))
    spec = load_workload(name_or_path)
    if prompts is not None:
        if prompts < 1:
            raise ConfigError(f"--prompts {prompts}: must be at least 1")
        spec = replace(spec, prompts=prompts)
    return synthetic_bench(spec, seed)
