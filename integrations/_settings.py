"""What every adapter is told: the job to run a trainer's batch as, and where (docs/trainers.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from heddle.exceptions import ConfigError
from heddle.export import FAILED_ROWS

__all__ = ["ENV_PREFIX", "WEIGHTS_SYNCS", "HeddleSettings", "setting_names"]

ENV_PREFIX = "HEDDLE_"  # HEDDLE_JOB, HEDDLE_POOL, HEDDLE_ENGINE, ... (from_env)
_MODES = ("local", "cluster")
_ENGINES = ("vllm", "sim")
WEIGHTS_SYNCS = ("disk", "push", "delta")  # how a weight hook hands the workers a version
_BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class HeddleSettings:
    """``job``: a RolloutJob YAML whose environment, sampling, reward and pool the
    trainer's batches run under (its ``tasks``, ``samplesPerTask`` and ``output`` are
    replaced per batch). ``mode``: ``local`` runs it on local workers as ``heddle run``
    does, ``cluster`` creates it through the Kubernetes API (the operator runs it, the
    output is read from ``data_root`` mounted here)."""

    job: str
    pool: str | None = None
    engine: str = "vllm"  # local mode: the workers' engine
    mode: str = "local"
    work_dir: str = "heddle-rollouts"  # each batch's output file (local mode)
    data_root: str = "/data"  # cluster mode: where the job's output volume is mounted
    namespace: str | None = None  # cluster mode
    failed: str = "placeholder"  # or drop, keep (heddle.export.order_rows)
    batch_window_s: float = 0.05  # per-sample adapters: how long one batch gathers calls
    time_scale: float = 1.0  # sim engine only
    # A weight hook's path (docs/trainers.md#pushing-weights-from-a-weight-hook): disk names
    # the written checkpoint for the next batches; push and delta send it over a process
    # group to push_workers (comma-separated URLs of the pool's running workers).
    weights_sync: str = "disk"
    push_workers: str | None = None
    push_address: str = "127.0.0.1"  # this trainer process, as the workers reach it
    push_backend: str = "gloo"  # nccl between GPUs
    push_device: str = "cpu"  # cuda:N with nccl
    push_token: str | None = field(default=None, repr=False)  # the pool's worker token

    def __post_init__(self) -> None:
        if not self.job:
            raise ConfigError("Heddle needs job: the path of a RolloutJob YAML")
        for name, value, allowed in (
            ("mode", self.mode, _MODES),
            ("engine", self.engine, _ENGINES),
            ("failed", self.failed, FAILED_ROWS),
            ("weights_sync", self.weights_sync, WEIGHTS_SYNCS),
            ("push_backend", self.push_backend, _BACKENDS),
        ):
            if value not in allowed:
                raise ConfigError(f"heddle {name} {value!r} is not one of {', '.join(allowed)}")
        if self.batch_window_s < 0:
            raise ConfigError("heddle batch_window_s must be 0 or more (seconds)")
        if self.weights_sync != "disk" and not (self.push_workers or "").strip():
            raise ConfigError(
                f"heddle weights_sync {self.weights_sync} needs push_workers: the URLs of the "
                "pool's workers, comma-separated (HEDDLE_PUSH_WORKERS)"
            )

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> HeddleSettings:
        """From a trainer's config section (keys as the fields here); unknown keys are
        refused so that a typo does not pass silently."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ConfigError(
                f"unknown Heddle setting(s) {', '.join(unknown)}; use {', '.join(sorted(known))}"
            )
        return cls(**{k: v for k, v in config.items() if v is not None})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **given: Any) -> HeddleSettings:
        """``given`` first, then ``HEDDLE_<FIELD>`` variables (Ray workers inherit them)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            if given.get(f.name) is not None:
                values[f.name] = given[f.name]
            elif f"{ENV_PREFIX}{f.name.upper()}" in env:
                raw = env[f"{ENV_PREFIX}{f.name.upper()}"]
                values[f.name] = float(raw) if f.type in ("float", float) else raw
        if "job" not in values:
            raise ConfigError(
                "Heddle needs a job: give job= in the trainer's config or set HEDDLE_JOB to "
                "the path of a RolloutJob YAML"
            )
        return cls(**values)


def setting_names() -> frozenset[str]:
    """The keys a trainer's config may give (the fields of :class:`HeddleSettings`)."""
    return frozenset(f.name for f in fields(HeddleSettings))
