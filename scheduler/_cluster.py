"""Cluster descriptions: GPUs, nodes, model and hardware, for planners and the simulator."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heddle.exceptions import ConfigError, WorkloadError

from ._limits import ENGINE_BATCH_CAP
from ._perf import HARDWARE_PRESETS, MODEL_PRESETS, PerfModel
from ._profiled import EngineProfile, ProfiledPerfModel, load_profile
from ._speculation import SpeculationConfig
from ._types import PoolShape, check_tp_sizes
from ._workload import _number, _take

__all__ = ["ClusterSpec"]


@dataclass(frozen=True)
class ClusterSpec:
    """A GPU pool as a benchmark sees it (the YAML format is in docs/workloads.md)."""

    name: str
    gpus: int
    gpus_per_node: int
    model: str
    hardware: str
    tensor_parallel_sizes: tuple[int, ...]
    baseline_tp: int
    batch_cap: int = ENGINE_BATCH_CAP
    # A measured engine (``heddle bench profile``) instead of the model and hardware presets.
    profile: EngineProfile | None = None
    # The baselines' stock vLLM speculation (``speculation:`` in the YAML); None: off.
    speculation: SpeculationConfig | None = None

    def __post_init__(self) -> None:
        if self.profile is not None:
            missing = sorted(set(self.tensor_parallel_sizes) - set(self.profile.tps))
            if missing:
                raise WorkloadError(
                    f"cluster {self.name!r}: profile {self.profile.name!r} measured TP "
                    f"{list(self.profile.tps)} only, not {missing}; set tensor_parallel_sizes "
                    "to measured degrees or profile a worker at those"
                )
        elif self.model not in MODEL_PRESETS:
            raise WorkloadError(
                f"cluster {self.name!r}: unknown model {self.model!r}; "
                f"choose one of {sorted(MODEL_PRESETS)}"
            )
        if self.profile is None and self.hardware not in HARDWARE_PRESETS:
            raise WorkloadError(
                f"cluster {self.name!r}: unknown hardware {self.hardware!r}; "
                f"choose one of {sorted(HARDWARE_PRESETS)}"
            )
        check_tp_sizes(self.tensor_parallel_sizes, self.gpus_per_node)
        if self.baseline_tp not in self.tensor_parallel_sizes:
            raise WorkloadError(
                f"cluster {self.name!r}: baseline_tp={self.baseline_tp} is not among "
                f"tensor_parallel_sizes={list(self.tensor_parallel_sizes)}"
            )
        if self.gpus % self.baseline_tp:
            raise WorkloadError(
                f"cluster {self.name!r}: gpus={self.gpus} is not a multiple of "
                f"baseline_tp={self.baseline_tp}"
            )

    @classmethod
    def from_dict(
        cls, data: Any, source: str = "cluster", base_dir: Path | None = None
    ) -> ClusterSpec:
        """``profile`` names a shipped profile or a JSON file (relative to ``base_dir``)."""
        optional = {"gpus_per_node", "hardware", "tensor_parallel_sizes", "baseline_tp"}
        optional |= {"batch_cap", "profile", "model", "speculation"}
        d = _take(data, source, {"name", "gpus"}, optional)
        profile = None
        if "profile" in d:
            if not isinstance(d["profile"], str) or not d["profile"]:
                raise WorkloadError(f"{source}.profile: expected a profile name or a file path")
            profile = load_profile(d["profile"], base_dir)
        elif "model" not in d:
            raise WorkloadError(f"{source}: missing field(s) ['model'] (or give a profile)")
        model = str(d["model"]).lower() if "model" in d or profile is None else profile.model.name
        sizes = d.get("tensor_parallel_sizes", [1, 2, 4, 8])
        if not isinstance(sizes, list) or not sizes:
            raise WorkloadError(f"{source}.tensor_parallel_sizes: expected a list, got {sizes!r}")
        return cls(
            name=str(d["name"]),
            gpus=int(_number(d["gpus"], f"{source}.gpus", minimum=1, integer=True)),
            gpus_per_node=int(
                _number(
                    d.get("gpus_per_node", 8), f"{source}.gpus_per_node", minimum=1, integer=True
                )
            ),
            model=model,
            hardware=str(d.get("hardware", "h100-sxm" if profile is None else "profiled")).lower(),
            tensor_parallel_sizes=tuple(
                int(_number(x, f"{source}.tensor_parallel_sizes[{i}]", minimum=1, integer=True))
                for i, x in enumerate(sizes)
            ),
            baseline_tp=int(
                _number(d.get("baseline_tp", 1), f"{source}.baseline_tp", minimum=1, integer=True)
            ),
            batch_cap=int(
                _number(d.get("batch_cap", 100), f"{source}.batch_cap", minimum=1, integer=True)
            ),
            profile=profile,
            speculation=_speculation(d.get("speculation"), f"{source}.speculation"),
        )

    def perf_model(self) -> PerfModel:
        if self.profile is not None:
            return ProfiledPerfModel.from_profile(self.profile, self.batch_cap)
        return PerfModel(MODEL_PRESETS[self.model], HARDWARE_PRESETS[self.hardware], self.batch_cap)

    def baseline_shape(self) -> PoolShape:
        """The homogeneous shape every baseline runs on."""
        return PoolShape.of({self.baseline_tp: self.gpus // self.baseline_tp})


def _speculation(data: Any, where: str) -> SpeculationConfig | None:
    """``{method: off|ngram|suffix, num_speculative_tokens: K}`` (K defaults to 4)."""
    if data is None:
        return None
    d = _take(data, where, {"method"}, {"num_speculative_tokens"})
    k = d.get("num_speculative_tokens", 4)
    k = int(_number(k, f"{where}.num_speculative_tokens", minimum=1, integer=True))
    try:
        return SpeculationConfig(str(d["method"]), k)
    except ConfigError as exc:
        raise WorkloadError(f"{where}: {exc}") from None
