"""The valid ranges of the sampling values a trajectory's steps send to an engine.

One place for what the RolloutJob parser, the CRD schema (checked by a test)
and the worker's wire messages accept. They are vLLM's ranges, narrowed where
vLLM takes a value it then fails on (a temperature above 2 breaks sampling on
the vLLM worker; a seed must fit the engine's 64-bit generator).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SAMPLING_LIMITS", "SamplingLimits"]


@dataclass(frozen=True)
class SamplingLimits:
    """Inclusive bounds unless the name says otherwise."""

    temperature_min: float = 0.0  # 0 is greedy
    temperature_max: float = 2.0
    top_p_exclusive_min: float = 0.0
    top_p_max: float = 1.0
    max_tokens_min: int = 1  # tokens of one step, and of a whole trajectory
    seed_min: int = 0
    seed_max: int = 2**63 - 1  # a signed 64-bit integer: the CRD's int64, torch's generator


SAMPLING_LIMITS = SamplingLimits()
