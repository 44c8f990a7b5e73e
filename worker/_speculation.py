"""Speculative decoding on a vLLM worker: the methods, their defaults, and vLLM's config.

One definition for every way a worker starts (``heddle worker --speculation``, the
EnginePool's ``spec.speculation``, ``heddle run``). Drafts from n-grams (vLLM's
``ngram``) or suffix trees (vLLM's ``suffix``, arctic-inference's cache) carry no
probabilities: a draft token is accepted iff it equals the token the target
samples, so the output distribution is the plain run's (docs/speculation.md).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from heddle.exceptions import ConfigError
from heddle.scheduler import AUTO_MAX_K

__all__ = [
    "DEFAULT_SPECULATIVE_TOKENS",
    "MAX_SPECULATIVE_TOKENS",
    "NO_SPECULATION",
    "SPECULATION_METHODS",
    "SPECULATION_REFUSED_SAMPLING",
    "BatchSizeTokens",
    "Speculation",
    "SpeculationMethod",
    "check_batch_size_table",
    "format_batch_size_table",
    "parse_batch_size_table",
    "suffix_available",
]

SpeculationMethod = Literal["off", "ngram", "suffix", "auto"]
SPECULATION_METHODS: tuple[str, ...] = get_args(SpeculationMethod)
DEFAULT_SPECULATIVE_TOKENS = AUTO_MAX_K  # K when none is given (heddle.scheduler)
MAX_SPECULATIVE_TOKENS = 32  # suffix trees draft at most their depth (vLLM's default 24)
# Sampling parameters vLLM refuses on every request while speculation is configured
# (SamplingParams._validate_spec_decode); Heddle's surfaces refuse them up front.
SPECULATION_REFUSED_SAMPLING = ("min_p", "logit_bias")

BatchSizeTokens = tuple[int, int, int]  # (smallest batch, largest batch, K), inclusive
_ENTRY = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*:\s*(\d+)\s*$")


def suffix_available() -> bool:
    """Whether vLLM's suffix decoding can run here (arctic-inference's suffix cache)."""
    try:
        return importlib.util.find_spec("arctic_inference.suffix_decoding") is not None
    except ModuleNotFoundError:
        return False


def parse_batch_size_table(
    text: str, where: str = "--speculative-tokens-by-batch-size"
) -> tuple[BatchSizeTokens, ...]:
    """``1-8:4,9-32:2,33-256:0`` as ((1, 8, 4), (9, 32, 2), (33, 256, 0)), checked."""
    entries: list[BatchSizeTokens] = []
    for part in (p for p in text.split(",") if p.strip()):
        m = _ENTRY.match(part)
        if m is None:
            raise ConfigError(
                f"{where} {part.strip()!r}: write each entry as FIRST-LAST:K (a batch-size "
                "range and its speculative tokens), e.g. 1-8:4,9-32:2,33-256:0"
            )
        entries.append((int(m[1]), int(m[2]), int(m[3])))
    return check_batch_size_table(entries, where)


def check_batch_size_table(
    entries: Sequence[Sequence[int]], where: str
) -> tuple[BatchSizeTokens, ...]:
    """vLLM's rules for ``num_speculative_tokens_per_batch_size``, as one sentence each:
    ranges from 1 up, in order, not overlapping; K from 0 (off at that batch size)."""
    table = tuple((int(a), int(b), int(k)) for a, b, k in entries)
    if not table:
        raise ConfigError(f"{where} is empty; give at least one range starting at batch size 1")
    previous_end = 0
    for first, last, k in table:
        if not 1 <= first <= last:
            raise ConfigError(f"{where} range {first}-{last}: give 1 <= first <= last batch size")
        if first != previous_end + 1:
            raise ConfigError(
                f"{where} range {first}-{last} must start at batch size {previous_end + 1}: "
                "ranges start at 1, in order, without gaps or overlaps"
            )
        if not 0 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(
                f"{where} range {first}-{last}: K={k} must be in 0..{MAX_SPECULATIVE_TOKENS} "
                "(0 turns speculation off at those batch sizes)"
            )
        previous_end = last
    if max(k for _, _, k in table) == 0:
        raise ConfigError(f"{where} drafts no token at any batch size; use speculation off")
    return table


def format_batch_size_table(table: Sequence[BatchSizeTokens]) -> str:
    return ",".join(f"{a}-{b}:{k}" for a, b, k in table)


@dataclass(frozen=True)
class Speculation:
    """How a worker's engine drafts: ``method``, K fixed or K by batch size.

    ``by_batch_size`` (when given) decides K per engine step from the number of
    running sequences; ``num_speculative_tokens`` is then its largest K. vLLM looks
    the table up, unless ``k_measured`` (``auto`` with suffix decoding): then vLLM runs
    at ``num_speculative_tokens`` and Heddle's proposer patch caps each step's K by a
    table that starts as ``by_batch_size`` and is rebuilt from the acceptance the
    engine measures (heddle.worker._vllm_patches.measure_k).
    """

    method: SpeculationMethod = "off"
    num_speculative_tokens: int = DEFAULT_SPECULATIVE_TOKENS
    by_batch_size: tuple[BatchSizeTokens, ...] = ()
    k_measured: bool = False

    def __post_init__(self) -> None:
        if self.method not in SPECULATION_METHODS:
            raise ConfigError(
                f"speculation {self.method!r} is not a method; use one of "
                f"{', '.join(SPECULATION_METHODS)}"
            )
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(
                f"num_speculative_tokens={self.num_speculative_tokens} must be in "
                f"1..{MAX_SPECULATIVE_TOKENS}"
            )

    @classmethod
    def of(
        cls,
        method: str,
        num_speculative_tokens: int | None = None,
        by_batch_size: Sequence[BatchSizeTokens] = (),
    ) -> Speculation:
        """From loose parts: K defaults to the table's largest, else the default."""
        table = tuple(by_batch_size)
        if num_speculative_tokens is None:
            num_speculative_tokens = (
                max(k for _, _, k in table) if table else DEFAULT_SPECULATIVE_TOKENS
            )
        elif table and max(k for _, _, k in table) > num_speculative_tokens:
            raise ConfigError(
                f"the batch-size table drafts up to {max(k for _, _, k in table)} tokens, more "
                f"than num_speculative_tokens={num_speculative_tokens}; raise it or leave it out"
            )
        return cls(cast(SpeculationMethod, method), num_speculative_tokens, table)

    @property
    def on(self) -> bool:
        return self.method != "off"

    def resolved(self) -> Speculation:
        """``auto`` as the method this machine runs: suffix where arctic-inference imports
        (drafts from siblings and history too), else ngram. K stays as given; the K table
        by batch size is for heddle.scheduler to choose (docs/speculation.md)."""
        if self.method != "auto":
            return self
        method: SpeculationMethod = "suffix" if suffix_available() else "ngram"
        return Speculation(method, self.num_speculative_tokens, self.by_batch_size, self.k_measured)

    def vllm_config(self) -> dict[str, Any] | None:
        """vLLM's ``speculative_config`` (``None``: off). Call on a resolved value."""
        if not self.on:
            return None
        if self.method == "auto":
            return self.resolved().vllm_config()
        if self.method == "suffix" and not suffix_available():
            raise ConfigError(
                "speculation 'suffix' needs arctic-inference (vLLM's suffix decoding), which "
                "is not installed: run `make setup` (it builds the wheel), or use 'ngram'"
            )
        config: dict[str, Any] = {
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
        }
        if self.by_batch_size and not self.k_measured:
            config["num_speculative_tokens_per_batch_size"] = [list(e) for e in self.by_batch_size]
        return config


NO_SPECULATION = Speculation()
