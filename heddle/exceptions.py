"""Every exception Heddle raises on purpose.

One module, imported by all parts (the scheduler included, so it must stay
stdlib-only). Catch :class:`HeddleError` to catch them all.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "HeddleError",
    "InfeasibleError",
    "WorkloadError",
]


class HeddleError(Exception):
    """Base class of every error Heddle raises deliberately."""


class ConfigError(HeddleError, ValueError):
    """A configuration value is invalid.

    The message quotes the bad value and says what would be valid, e.g.
    ``tensor-parallel size 3 does not divide gpus_per_node=8; use one of [1, 2, 4, 8]``.
    """


class WorkloadError(ConfigError):
    """A workload or cluster description is malformed (names the field at fault)."""


class InfeasibleError(HeddleError):
    """No plan satisfies the constraints (e.g. no TP mix fits the GPU budget)."""
