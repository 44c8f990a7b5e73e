"""K from the acceptance an engine measures: the table a worker's ``auto`` drafts by.

A worker started with ``auto`` begins at :func:`auto_k_table` (built on an acceptance
it assumes: our pessimistic measurement). :class:`MeasuredKTable` then counts, per
engine, the tokens each verified request-step gave at the K it was asked for, fits one
geometric per-draft acceptance to those counts (:func:`fit_alpha`) and rebuilds the
batch-size -> K table on it every ``rebuild_every_steps`` request-steps, older counts
fading by ``decay`` at each rebuild (a rollout's acceptance rises as siblings' texts
reach the tree). The live worker runs this object inside vLLM's worker process, where
the suffix proposer's K is capped (heddle.worker._vllm_patches); the simulator's
engines run the same object on the tokens their segments gave (sim/_speculation.py).

A table rebuilt with no K anywhere keeps K=1 at a batch of one, so the acceptance
stays measured. A request-step asked for K drafts gives ``1 + accepted`` tokens; a draft the
proposer cut short (no match in the tree) counts as a rejection there, so the fit is
the acceptance the engine *gets* at each K, which is what the table trades against
verification time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from heddle.exceptions import ConfigError

from ._perf import PerfModel
from ._speculation import (
    ACCEPTANCE_PRESETS,
    AUTO_ACCEPTANCE,
    AUTO_MAX_K,
    AUTO_SIBLINGS,
    auto_context_tokens,
    auto_k_table,
    geometric_tokens_per_step,
    k_by_batch_size,
    k_table_ranges,
)

__all__ = ["K_TABLE_FORMAT", "KTableSettings", "MeasuredKTable", "fit_alpha"]

K_TABLE_FORMAT: Final = "heddle.k-table/v1"  # the state a worker reports (/v1/state)


@dataclass(frozen=True)
class KTableSettings:
    """How a :class:`MeasuredKTable` learns.

    ``rebuild_every_steps``: request-steps (one request verified once) between rebuilds;
    ``prior_steps``: the assumed acceptance counts as this many request-steps at the
    largest K (at the default cadence about a ninth of the first rebuild's counts,
    fading with them); ``decay``: the share
    of the counts kept at each rebuild; ``alpha_resolution``: the fitted acceptance is
    rounded to this before a table is built (tables are cached by it, and a table does
    not flap on noise).
    """

    rebuild_every_steps: int = 2048
    prior_steps: float = 256.0
    decay: float = 0.5
    alpha_resolution: float = 0.01

    def __post_init__(self) -> None:
        if self.rebuild_every_steps < 1:
            raise ConfigError(f"rebuild_every_steps={self.rebuild_every_steps} must be >= 1")
        if self.prior_steps < 0:
            raise ConfigError(f"prior_steps={self.prior_steps} must be >= 0")
        if not 0.0 <= self.decay <= 1.0:
            raise ConfigError(f"decay={self.decay} must be between 0 and 1")
        if not 0.0 < self.alpha_resolution <= 0.1:
            raise ConfigError(f"alpha_resolution={self.alpha_resolution} must be in (0, 0.1]")


def fit_alpha(steps: Mapping[int, float], tokens: Mapping[int, float]) -> float:
    """The geometric per-draft acceptance ``a`` whose expected tokens, summed over the
    request-steps at each K (``steps[k]``), equal the tokens they gave (``tokens[k]``).

    Monotone in ``a``, so a bisection finds it; 0 where the steps gave no more than
    one token each, 1 where every draft was taken."""
    ks = [k for k in steps if k > 0 and steps[k] > 0]
    if not ks:
        raise ConfigError("no request-step drafted: nothing to fit an acceptance on")
    want = sum(tokens[k] for k in ks)

    def expected(a: float) -> float:
        return sum(steps[k] * geometric_tokens_per_step(a, k) for k in ks)

    if want <= expected(0.0):
        return 0.0
    if want >= expected(1.0):
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if expected(mid) < want:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class MeasuredKTable:
    """One engine's batch-size -> K table, rebuilt from the acceptance it measures.

    ``k_at(batch)`` is the K to draft at; ``record(k, steps, tokens)`` adds what
    ``steps`` request-steps asked for ``k`` drafts gave. Until the first rebuild the
    table is :func:`auto_k_table`'s. ``cache`` (optional) shares built tables between
    engines on one performance model (a pool's): keyed by TP, largest K, batch cap,
    context and the rounded acceptance.
    """

    def __init__(
        self,
        perf: PerfModel,
        tp: int,
        method: str,
        *,
        max_num_seqs: int,
        max_model_len: int | None = None,
        max_k: int = AUTO_MAX_K,
        settings: KTableSettings = KTableSettings(),
        cache: dict[tuple[int, int, int, float, float], tuple[tuple[int, int], ...]] | None = None,
    ) -> None:
        if max_k < 1:
            raise ConfigError(f"max_k={max_k} must be at least 1")
        self.perf, self.tp, self.method = perf, tp, method
        self.max_num_seqs, self.max_k, self.settings = max_num_seqs, max_k, settings
        self.context_tokens = auto_context_tokens(max_model_len)
        self._cache = {} if cache is None else cache
        self.table = auto_k_table(
            perf, tp, method, max_num_seqs=max_num_seqs, max_model_len=max_model_len, max_k=max_k
        )
        siblings = AUTO_SIBLINGS if method == "suffix" else 0
        assumed = ACCEPTANCE_PRESETS[AUTO_ACCEPTANCE].tokens_per_step(
            method, max_k, siblings=siblings
        )
        self._steps: dict[int, float] = {max_k: settings.prior_steps}
        self._tokens: dict[int, float] = {max_k: settings.prior_steps * assumed}
        self._since = 0.0
        self.alpha: float | None = None  # the acceptance the table was last built on
        self.rebuilds = 0
        self.measured_steps = 0.0  # request-steps recorded, all told
        self.measured_tokens = 0.0

    def k_at(self, batch: int) -> int:
        """K for ``batch`` running sequences (past the table's end, its last K)."""
        for up_to, k in self.table:
            if batch <= up_to:
                return k
        return self.table[-1][1] if self.table else 0

    def record(self, k: int, steps: float, tokens: float) -> bool:
        """``steps`` request-steps asked for ``k`` drafts gave ``tokens`` tokens (each at
        least one); True where this rebuilt the table."""
        if k <= 0 or steps <= 0:
            return False
        k = min(k, self.max_k)
        tokens = min(max(tokens, steps), steps * (k + 1))
        self._steps[k] = self._steps.get(k, 0.0) + steps
        self._tokens[k] = self._tokens.get(k, 0.0) + tokens
        self.measured_steps += steps
        self.measured_tokens += tokens
        self._since += steps
        if self._since < self.settings.rebuild_every_steps:
            return False
        self.rebuild()
        return True

    def rebuild(self) -> None:
        """Fit the acceptance on the counts, rebuild the table on it, fade the counts."""
        step = self.settings.alpha_resolution
        alpha = round(fit_alpha(self._steps, self._tokens) / step) * step
        alpha = round(alpha, 6)
        key = (self.tp, self.max_k, self.max_num_seqs, self.context_tokens, alpha)
        table = self._cache.get(key)
        if table is None:
            table = k_by_batch_size(
                self.perf,
                self.tp,
                self.context_tokens,
                lambda k: geometric_tokens_per_step(alpha, k),
                self.max_num_seqs,
                tuple(range(1, self.max_k + 1)),
            )
            if table and max(k for _, k in table) == 0:
                # Off everywhere, nothing more would be measured and the table would never
                # learn that drafts pay again: keep K=1 at a batch of one, where a draft
                # costs a memory-bound engine next to nothing.
                table = ((1, 1), (self.max_num_seqs, 0)) if self.max_num_seqs > 1 else ((1, 1),)
            self._cache[key] = table
        self.table, self.alpha = table, alpha
        self.rebuilds += 1
        self._since = 0.0
        decay = self.settings.decay
        self._steps = {k: v * decay for k, v in self._steps.items()}
        self._tokens = {k: v * decay for k, v in self._tokens.items()}

    def state(self) -> dict[str, Any]:
        """What a worker reports (``/v1/state.speculation.k_table``): JSON-able."""
        return {
            "format": K_TABLE_FORMAT,
            "by_batch_size": [list(row) for row in k_table_ranges(self.table)],
            "alpha": self.alpha,
            "rebuilds": self.rebuilds,
            "measured_steps": round(self.measured_steps),
            "measured_tokens_per_step": (
                self.measured_tokens / self.measured_steps if self.measured_steps else None
            ),
        }
