"""Synthetic agentic workloads: GRPO groups of multi-turn, tool-calling trajectories.

A workload file (YAML in ``scheduler/presets/``, parsed by the CLI; this module
takes the resulting dict) describes distributions; :func:`generate` draws
concrete trajectory scripts from them, deterministically for a seed. The
format is documented in docs/workloads.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from heddle.exceptions import WorkloadError

__all__ = [
    "LENGTH_FAMILIES",
    "Distribution",
    "ToolSpec",
    "TrajectoryScript",
    "WorkloadSpec",
    "generate",
]


LENGTH_FAMILIES = ("lognormal", "pareto", "bimodal")


def _take(data: Any, path: str, required: set[str], optional: set[str]) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        # Values are never quoted: a workload may be read from a file that is not one.
        raise WorkloadError(f"{path}: expected a mapping, got {_kind(data)}")
    keys = set(data)
    missing = required - keys
    if missing:
        raise WorkloadError(f"{path}: missing field(s) {sorted(missing)}")
    unknown = keys - required - optional
    if unknown:
        raise WorkloadError(
            f"{path}: {len(unknown)} unknown field(s); valid fields are "
            f"{sorted(required | optional)}"
        )
    return dict(data)


def _kind(value: Any) -> str:
    if isinstance(value, list) and not value:
        return "an empty list"
    return f"a {type(value).__name__}"


def _number(value: Any, path: str, *, minimum: float = 0.0, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WorkloadError(f"{path}: expected a finite number, got {_kind(value)}")
    if value < minimum:
        raise WorkloadError(f"{path}: below the minimum {minimum}")
    if integer and int(value) != value:
        raise WorkloadError(f"{path}: expected a whole number, got a fraction")
    return float(value)


@dataclass(frozen=True)
class Distribution:
    """A log-normal given by its median and log-space SD, clipped to ``[minimum, maximum]``."""

    median: float
    sigma: float = 0.0
    minimum: float = 0.0
    maximum: float = math.inf

    @classmethod
    def from_dict(cls, data: Any, path: str) -> Distribution:
        d = _take(data, path, {"median"}, {"sigma", "min", "max"})
        dist = cls(
            median=_number(d["median"], f"{path}.median", minimum=1e-9),
            sigma=_number(d.get("sigma", 0.0), f"{path}.sigma"),
            minimum=_number(d.get("min", 0.0), f"{path}.min"),
            maximum=_number(d.get("max", math.inf), f"{path}.max") if "max" in d else math.inf,
        )
        if dist.maximum < dist.minimum:
            raise WorkloadError(f"{path}: max is below min")
        return dist

    def draw(self, rng: np.random.Generator, size: int | None = None) -> Any:
        value = self.median * np.exp(self.sigma * rng.standard_normal(size))
        return np.clip(value, self.minimum, self.maximum)


@dataclass(frozen=True)
class ToolSpec:
    """One tool: how often it is chosen, its latency (s) and its reply length (tokens)."""

    name: str
    weight: float
    latency_s: Distribution
    output_tokens: Distribution

    @classmethod
    def from_dict(cls, data: Any, path: str) -> ToolSpec:
        d = _take(data, path, {"name", "latency_s"}, {"weight", "output_tokens"})
        latency = _take(d["latency_s"], f"{path}.latency_s", {"mean"}, {"sigma", "max"})
        mean = _number(latency["mean"], f"{path}.latency_s.mean", minimum=0.0)
        sigma = _number(latency.get("sigma", 0.5), f"{path}.latency_s.sigma")
        # Given by its mean (what papers report); the median follows for a log-normal.
        median = max(mean, 1e-9) * math.exp(-0.5 * sigma**2)
        cap = _number(latency.get("max", 60.0), f"{path}.latency_s.max", minimum=0.0)
        out = d.get("output_tokens", {"median": 128, "sigma": 0.5, "min": 1, "max": 4096})
        return cls(
            name=str(d["name"]),
            weight=_number(d.get("weight", 1.0), f"{path}.weight", minimum=1e-9),
            latency_s=Distribution(median, sigma, 0.0, cap),
            output_tokens=Distribution.from_dict(out, f"{path}.output_tokens"),
        )


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload: GRPO groups whose samples' lengths correlate.

    Output tokens of a trajectory: ``exp(log median + G + within_sigma * e)``,
    clipped to ``max``, where the prompt's effect ``G`` is shared by its samples:
    ``group_sigma * g`` (``family: lognormal``, the default; the sibling
    correlation of log length is ``group_sigma² / (group_sigma² + within_sigma²)``),
    the log of a Pareto(``alpha``) factor of median 1 (``family: pareto``: a
    power-law tail of hard prompts), or ``log(long_median / median)`` for a
    ``long_fraction`` of prompts and 0 for the rest, plus ``group_sigma * g``
    (``family: bimodal``: easy and hard prompts). Turns grow with length:
    ``median_turns * (tokens / median)^length_exponent``.
    """

    name: str
    prompts: int
    samples_per_prompt: int
    prompt_tokens: Distribution
    output_median: float
    group_sigma: float
    within_sigma: float
    max_output_tokens: int
    turns_median: float
    turns_length_exponent: float
    turns_sigma: float
    max_turns: int
    tools: tuple[ToolSpec, ...]
    description: str = ""
    family: str = "lognormal"  # of the prompt effect: lognormal, pareto, bimodal
    pareto_alpha: float = 0.0  # pareto: tail index (smaller: heavier tail)
    long_fraction: float = 0.0  # bimodal: share of hard prompts
    long_median: float = 0.0  # bimodal: median output tokens of a hard prompt

    def __post_init__(self) -> None:
        if self.family not in LENGTH_FAMILIES:
            raise WorkloadError(
                f"{self.name}: output_tokens.family {self.family!r} is not one of "
                f"{list(LENGTH_FAMILIES)}"
            )
        if self.family == "pareto" and self.pareto_alpha <= 0:
            raise WorkloadError(f"{self.name}: output_tokens.alpha must be > 0 for family pareto")
        if self.family == "bimodal" and not (0 < self.long_fraction < 1 and self.long_median > 0):
            raise WorkloadError(
                f"{self.name}: family bimodal needs output_tokens.long_fraction in (0, 1) "
                "and long_median > 0"
            )

    def group_effect(self, rng: np.random.Generator) -> float:
        """The log-length shift a prompt gives all its samples."""
        if self.family == "pareto":
            return (float(rng.exponential()) - math.log(2.0)) / self.pareto_alpha
        if self.family == "bimodal":
            hard = float(rng.random()) < self.long_fraction
            shift = math.log(self.long_median / self.output_median) if hard else 0.0
            return shift + self.group_sigma * float(rng.standard_normal())
        return self.group_sigma * float(rng.standard_normal())

    @classmethod
    def from_dict(cls, data: Any, source: str = "workload") -> WorkloadSpec:
        d = _take(
            data,
            source,
            {"name", "prompts", "samples_per_prompt", "output_tokens", "turns", "tools"},
            {"description", "prompt_tokens"},
        )
        out = _take(
            d["output_tokens"],
            f"{source}.output_tokens",
            {"median", "max"},
            {"group_sigma", "within_sigma", "family", "alpha", "long_fraction", "long_median"},
        )
        turns = _take(
            d["turns"], f"{source}.turns", {"median"}, {"length_exponent", "sigma", "max"}
        )
        tools = d["tools"]
        if not isinstance(tools, list) or not tools:
            raise WorkloadError(
                f"{source}.tools: expected a non-empty list of tools, got {_kind(tools)}"
            )
        spec = cls(
            name=str(d["name"]),
            description=str(d.get("description", "")),
            prompts=int(_number(d["prompts"], f"{source}.prompts", minimum=1, integer=True)),
            samples_per_prompt=int(
                _number(
                    d["samples_per_prompt"], f"{source}.samples_per_prompt", minimum=1, integer=True
                )
            ),
            prompt_tokens=Distribution.from_dict(
                d.get("prompt_tokens", {"median": 512}), f"{source}.prompt_tokens"
            ),
            output_median=_number(out["median"], f"{source}.output_tokens.median", minimum=1),
            group_sigma=_number(out.get("group_sigma", 0.0), f"{source}.output_tokens.group_sigma"),
            within_sigma=_number(
                out.get("within_sigma", 0.0), f"{source}.output_tokens.within_sigma"
            ),
            family=str(out.get("family", "lognormal")),
            pareto_alpha=_number(out.get("alpha", 0.0), f"{source}.output_tokens.alpha"),
            long_fraction=_number(
                out.get("long_fraction", 0.0), f"{source}.output_tokens.long_fraction"
            ),
            long_median=_number(out.get("long_median", 0.0), f"{source}.output_tokens.long_median"),
            max_output_tokens=int(
                _number(out["max"], f"{source}.output_tokens.max", minimum=1, integer=True)
            ),
            turns_median=_number(turns["median"], f"{source}.turns.median", minimum=1),
            turns_length_exponent=_number(
                turns.get("length_exponent", 0.5), f"{source}.turns.length_exponent"
            ),
            turns_sigma=_number(turns.get("sigma", 0.0), f"{source}.turns.sigma"),
            max_turns=int(
                _number(turns.get("max", 64), f"{source}.turns.max", minimum=1, integer=True)
            ),
            tools=tuple(ToolSpec.from_dict(t, f"{source}.tools[{i}]") for i, t in enumerate(tools)),
        )
        return spec

    @property
    def trajectories(self) -> int:
        return self.prompts * self.samples_per_prompt


@dataclass(frozen=True)
class TrajectoryScript:
    """One trajectory's truth: turn lengths, and a tool call after each turn but the last."""

    id: str
    group_id: str
    sample: int
    prompt_tokens: int
    turn_tokens: tuple[int, ...]
    tool_names: tuple[str, ...]
    tool_latency_s: tuple[float, ...]
    tool_output_tokens: tuple[int, ...]
    # From a token-level trace (docs/workloads.md, "Token traces"): each step's generated
    # token ids, kept for replaying drafts against them; empty for drawn scripts.
    step_token_ids: tuple[tuple[int, ...], ...] = ()

    @property
    def total_tokens(self) -> int:
        return sum(self.turn_tokens)

    @property
    def turns(self) -> int:
        return len(self.turn_tokens)


def _split(total: int, parts: int, rng: np.random.Generator) -> tuple[int, ...]:
    """``total`` tokens over ``parts`` turns, each at least 1, Dirichlet(2) shares."""
    shares = rng.dirichlet(np.full(parts, 2.0))
    extra = np.floor(shares * (total - parts)).astype(int)
    extra[: (total - parts) - int(extra.sum())] += 1
    return tuple(int(x) + 1 for x in extra)


def generate(spec: WorkloadSpec, seed: int = 0) -> list[TrajectoryScript]:
    """Draw every trajectory of the workload; the same seed gives the same scripts."""
    rng = np.random.default_rng(seed)
    weights = np.array([t.weight for t in spec.tools])
    weights = weights / weights.sum()
    log_median = math.log(spec.output_median)
    scripts: list[TrajectoryScript] = []
    for p in range(spec.prompts):
        group_id = f"{spec.name}-p{p:05d}"
        prompt_tokens = max(1, int(spec.prompt_tokens.draw(rng)))
        group_effect = spec.group_effect(rng)
        for s in range(spec.samples_per_prompt):
            log_len = log_median + group_effect + spec.within_sigma * rng.standard_normal()
            total = int(min(spec.max_output_tokens, max(1.0, math.exp(log_len))))
            log_turns = (
                math.log(spec.turns_median)
                + spec.turns_length_exponent * (math.log(total) - log_median)
                + spec.turns_sigma * rng.standard_normal()
            )
            turns = int(min(spec.max_turns, total, max(1, round(math.exp(log_turns)))))
            tool_idx = rng.choice(len(spec.tools), size=turns - 1, p=weights)
            chosen = [spec.tools[i] for i in tool_idx]
            scripts.append(
                TrajectoryScript(
                    id=f"{group_id}-s{s:02d}",
                    group_id=group_id,
                    sample=s,
                    prompt_tokens=prompt_tokens,
                    turn_tokens=_split(total, turns, rng),
                    tool_names=tuple(t.name for t in chosen),
                    tool_latency_s=tuple(float(t.latency_s.draw(rng)) for t in chosen),
                    tool_output_tokens=tuple(
                        max(1, int(t.output_tokens.draw(rng))) for t in chosen
                    ),
                )
            )
    return scripts
