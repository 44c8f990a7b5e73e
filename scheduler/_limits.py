"""The valid ranges and the defaults of what a trajectory's steps send to an engine.

One place for what the RolloutJob parser, the CRD schema (checked by a test)
and the worker's wire messages accept, and for the values they take when a
job or a request leaves them out (docs/resources.md refers here). The ranges
are vLLM's, narrowed where vLLM takes a value it then fails on (a temperature
above 2 breaks sampling on the vLLM worker; a seed must fit the engine's
64-bit generator).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ENGINE_BATCH_CAP",
    "SAMPLING_DEFAULTS",
    "SAMPLING_LIMITS",
    "SamplingDefaults",
    "SamplingLimits",
]


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


@dataclass(frozen=True)
class SamplingDefaults:
    """Sampling values nobody set: a RolloutJob's ``spec.sampling``, a bare worker request."""

    temperature: float = 1.0  # the model's own distribution (RL samples from it)
    top_p: float = 1.0
    max_tokens_per_turn: int = 1024  # a RolloutJob: output tokens of one LLM step at most
    max_total_tokens: int = 8192  # a RolloutJob: output tokens of a whole trajectory at most
    max_tokens_per_request: int = 256  # a worker request that names no max_tokens


SAMPLING_DEFAULTS = SamplingDefaults()

# Requests one engine runs at once: vLLM's ``max_num_seqs`` on a worker, the batch cap of
# the performance model and the simulator (the paper's baselines run with 100 per engine).
ENGINE_BATCH_CAP = 100
