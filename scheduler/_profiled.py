"""A performance model measured on a real engine instead of derived from datasheets.

``heddle bench profile`` drives one real ``heddle worker`` with controlled
batches and writes an *engine profile* (JSON, format in
docs/performance-model.md): decode iteration times over batch size and
context length, and prefill times over prompt length, at each TP degree it
measured. :class:`ProfiledPerfModel` answers the questions :class:`PerfModel`
answers from that profile, so the simulator and the planners use it unchanged.

The form, per TP degree (nonnegative least squares over every measured point)::

    iteration_time(b, C) = fixed + per_sequence * b + per_context_token * C   (C: batch context)
    prefill_time(n)      = fixed_s + per_token_s * n + per_token_squared_s * n^2

Decode scaled by what the profile measured on a rollout-shaped load
(``decode_scale``: the engine core's decode time there over what this model
charges for the same iterations and the prefills admitted beside them; 1 when
absent): the grid's controlled batches leave the
cores to the engines, a rollout shares them with the workers' API processes
and the session, and new requests join all the time. Prefill is not scaled:
on a running engine vLLM's time to the first token is a whole mixed
iteration, so the same ratio for prefill mixes the batch's decode into it.

Linear in ``C`` because attention reads each resident token's KV once per
step (the profile's residuals say how well that holds); it also keeps
:meth:`segment_time` a closed form, which the simulator needs to jump from
batch change to batch change. A profile file stores the fit per measured
batch size (``fixed_s[b]``, ``per_context_token_s[b]``), so a hand-written or
differently fitted table loads too: between measured sizes the coefficients
are interpolated linearly, beyond the largest extrapolated from the last two.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from heddle.exceptions import ConfigError, WorkloadError

from ._limits import ENGINE_BATCH_CAP
from ._perf import HardwareSpec, ModelSpec, PerfModel

__all__ = [
    "PROFILE_FORMAT",
    "DecodeFit",
    "EngineProfile",
    "PrefillFit",
    "ProfiledPerfModel",
    "StepOverhead",
    "fit_decode",
    "fit_prefill",
    "load_profile",
]

PROFILE_FORMAT = "heddle-engine-profile/1"


@dataclass(frozen=True)
class DecodeFit:
    """Decode iteration time at one TP: per measured batch size, fixed + per context token."""

    batch_sizes: tuple[int, ...]
    fixed_s: tuple[float, ...]
    per_context_token_s: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.batch_sizes)
        if n == 0 or len(self.fixed_s) != n or len(self.per_context_token_s) != n:
            raise WorkloadError("decode fit: batch_sizes, fixed_s, per_context_token_s differ")
        if list(self.batch_sizes) != sorted(set(self.batch_sizes)) or self.batch_sizes[0] < 1:
            raise WorkloadError("decode fit: batch_sizes must be increasing and at least 1")

    def at(self, batch: int) -> tuple[float, float]:
        """(fixed_s, per_context_token_s) at ``batch``, interpolated or extrapolated."""
        bs, f, g = self.batch_sizes, self.fixed_s, self.per_context_token_s
        if batch <= bs[0] or len(bs) == 1:
            return f[0], g[0]
        i = next((k for k in range(1, len(bs)) if bs[k] >= batch), len(bs) - 1)
        w = (batch - bs[i - 1]) / (bs[i] - bs[i - 1])
        fixed = f[i - 1] + w * (f[i] - f[i - 1])
        slope = g[i - 1] + w * (g[i] - g[i - 1])
        # Extrapolation keeps the last slope in b but never goes below the last measurement.
        return max(fixed, f[-1] if batch > bs[-1] else 0.0), max(slope, 0.0)


@dataclass(frozen=True)
class PrefillFit:
    """Prefill of ``n`` uncached tokens: fixed + per token + per token squared (attention)."""

    fixed_s: float
    per_token_s: float
    per_token_squared_s: float = 0.0

    def time(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        return self.fixed_s + self.per_token_s * tokens + self.per_token_squared_s * tokens**2


@dataclass(frozen=True)
class StepOverhead:
    """How a profile measured a step's time outside the engine core (seconds per step).

    ``isolated_median_s`` on controlled batches; ``rollout_*`` on a rollout-shaped
    load (multi-turn chat trajectories with tool gaps, ``trajectories_per_worker``
    at once). The simulator uses ``rollout_mean_s``: a makespan adds up steps.
    """

    isolated_median_s: float
    rollout_mean_s: float
    rollout_median_s: float
    trajectories_per_worker: int

    def __post_init__(self) -> None:
        times = (self.isolated_median_s, self.rollout_mean_s, self.rollout_median_s)
        if any(not t >= 0 for t in times) or self.trajectories_per_worker < 1:
            raise WorkloadError(
                "step_overhead: times must be numbers >= 0 and trajectories_per_worker >= 1"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepOverhead:
        return cls(
            float(data["isolated_median_s"]),
            float(data["rollout_mean_s"]),
            float(data["rollout_median_s"]),
            int(data["rollout_trajectories_per_worker"]),
        )


@dataclass(frozen=True)
class EngineProfile:
    """What ``heddle bench profile`` measured on one engine (one model, some TP degrees)."""

    name: str
    model: ModelSpec
    kv_capacity_tokens: Mapping[int, int]
    decode: Mapping[int, DecodeFit]
    prefill: Mapping[int, PrefillFit]
    source: str = "profile"
    # Per step, outside the engine core (client's clock minus the engine core's time).
    request_overhead_s: float = 0.0
    step_overhead: StepOverhead | None = None  # how request_overhead_s was measured
    # The engine core's decode under a rollout-shaped load over the fit's (1: as fitted).
    decode_scale: float = 1.0
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def tps(self) -> tuple[int, ...]:
        return tuple(sorted(self.decode))

    @classmethod
    def from_dict(cls, data: Any, source: str = "profile") -> EngineProfile:
        if not isinstance(data, Mapping) or data.get("format") != PROFILE_FORMAT:
            raise WorkloadError(
                f"{source}: not an engine profile (expected format: {PROFILE_FORMAT!r}); "
                "write one with `heddle bench profile`"
            )
        try:
            m = data["model"]
            model = ModelSpec(
                str(m["name"]),
                float(m["params_billion"]),
                int(m["num_layers"]),
                int(m["hidden_size"]),
                int(m["num_kv_heads"]),
                int(m["head_dim"]),
                int(m.get("bytes_per_param", 2)),
            )
            kv = {int(tp): int(v) for tp, v in data["kv_capacity_tokens"].items()}
            decode = {
                int(tp): DecodeFit(
                    tuple(int(b) for b in d["batch_sizes"]),
                    tuple(float(x) for x in d["fixed_s"]),
                    tuple(float(x) for x in d["per_context_token_s"]),
                )
                for tp, d in data["decode"].items()
            }
            prefill = {
                int(tp): PrefillFit(
                    float(p["fixed_s"]),
                    float(p["per_token_s"]),
                    float(p.get("per_token_squared_s", 0.0)),
                )
                for tp, p in data["prefill"].items()
            }
            measured = data.get("step_overhead")
            step_overhead = None if measured is None else StepOverhead.from_dict(measured)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WorkloadError(
                f"{source}: malformed engine profile ({type(exc).__name__}: {exc}); "
                "write it again with `heddle bench profile`"
            ) from None
        if not decode or set(decode) != set(prefill) or not set(decode) <= set(kv):
            raise WorkloadError(
                f"{source}: decode, prefill and kv_capacity_tokens must cover the same TP degrees"
            )
        # A profile with only the measurement section uses its rollout-shaped mean.
        fallback = 0.0 if step_overhead is None else step_overhead.rollout_mean_s
        overhead = data.get("request_overhead_s", fallback)
        if isinstance(overhead, bool) or not isinstance(overhead, int | float) or overhead < 0:
            raise WorkloadError(f"{source}: request_overhead_s must be a number >= 0")
        scale = data.get("decode_scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not scale > 0:
            raise WorkloadError(f"{source}: decode_scale must be a number > 0")
        name = str(data.get("name", source))
        return cls(
            name, model, kv, decode, prefill, source, float(overhead), step_overhead,
            float(scale), data,
        )  # fmt: skip


def load_profile(name_or_path: str | Path, base_dir: Path | None = None) -> EngineProfile:
    """A shipped profile (``vllm-cpu-tiny``) or a JSON file (relative to ``base_dir``)."""
    text = str(name_or_path)
    shipped = resources.files("heddle.scheduler").joinpath("presets", f"profile-{text}.json")
    if "/" not in text and not text.endswith(".json") and shipped.is_file():
        return EngineProfile.from_dict(json.loads(shipped.read_text("utf-8")), f"profile {text!r}")
    path = Path(text)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WorkloadError(
            f"engine profile {text!r} is neither a shipped profile (vllm-cpu-tiny) nor a "
            f"readable file ({exc.strerror}); write one with `heddle bench profile --out DIR`"
        ) from None
    except ValueError as exc:
        raise WorkloadError(f"engine profile {path}: not JSON ({exc})") from None
    return EngineProfile.from_dict(data, str(path))


def fit_decode(points: Sequence[tuple[int, float, float]]) -> DecodeFit:
    """``fixed + per_sequence * b + per_context_token * C`` from (batch, context, seconds).

    One nonnegative least-squares fit over every point, written out per
    measured batch size. Three terms, not a free table per batch size: on a
    shared CPU single points are off by up to half (the profile records its
    largest relative residual), and a table would keep that noise.
    """
    b = np.asarray([float(p[0]) for p in points])
    c = np.asarray([float(p[1]) for p in points])
    y = np.asarray([float(p[2]) for p in points])
    coef = _nonnegative_fit(np.stack([np.ones_like(b), b, c], axis=1), y)
    sizes = sorted({int(p[0]) for p in points})
    fixed = tuple(float(coef[0] + coef[1] * size) for size in sizes)
    return DecodeFit(tuple(sizes), fixed, tuple(float(coef[2]) for _ in sizes))


def _nonnegative_fit(columns: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: the best fit over subsets of the columns."""
    width = columns.shape[1]
    best: tuple[float, np.ndarray] | None = None
    for size in range(width, 0, -1):
        for keep in itertools.combinations(range(width), size):
            coef, *_ = np.linalg.lstsq(columns[:, keep], y, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(width)
            full[list(keep)] = coef
            err = float(((columns @ full - y) ** 2).sum())
            if best is None or err < best[0]:
                best = (err, full)
    return best[1] if best is not None else np.zeros(width)


def fit_prefill(points: Sequence[tuple[int, float]]) -> PrefillFit:
    """Nonnegative least squares of ``a + b n + c n^2`` from (tokens, seconds)."""
    n = np.asarray([float(t) for t, _ in points])
    y = np.asarray([float(s) for _, s in points])
    a, b, c = _nonnegative_fit(np.stack([np.ones_like(n), n, n * n], axis=1), y)
    return PrefillFit(float(a), float(b), float(c))


@dataclass(frozen=True)
class ProfiledPerfModel(PerfModel):
    """:class:`PerfModel`'s questions answered from an :class:`EngineProfile`.

    Build it with :meth:`from_profile`; ``model`` comes from the profile and
    ``hardware`` only names it (no datasheet constant is used).
    """

    profile: EngineProfile = field(kw_only=True)

    @classmethod
    def from_profile(
        cls,
        profile: EngineProfile,
        batch_cap: int = ENGINE_BATCH_CAP,
        typical_context_tokens: int = 1024,
    ) -> ProfiledPerfModel:
        hardware = HardwareSpec(f"profiled:{profile.name}", 0.0, 0.0, 0.0, 0.0)
        return cls(profile.model, hardware, batch_cap, typical_context_tokens, profile=profile)

    def _decode(self, batch: int, tp: int) -> tuple[float, float]:
        fit = self.profile.decode.get(tp)
        if fit is None:
            raise ConfigError(
                f"engine profile {self.profile.name!r} has no measurements at TP{tp} "
                f"(it has TP {list(self.profile.tps)}); restrict tensor_parallel_sizes to "
                "those or profile a worker at that TP"
            )
        fixed, slope = fit.at(batch)
        scale = self.profile.decode_scale
        return fixed * scale, slope * scale

    @property
    def step_overhead_s(self) -> float:
        return self.profile.request_overhead_s

    def kv_capacity_tokens(self, tp: int) -> int:
        return int(self.profile.kv_capacity_tokens.get(tp, 0))

    def _fixed_time(self, batch: int, tp: int, draft_tokens: int = 0) -> float:
        return self._decode(batch * (draft_tokens + 1), tp)[0]

    def _roofline_terms(
        self, batch: int, tp: int, draft_tokens: int = 0
    ) -> tuple[float, float, float, float]:
        """The measured step, linear in context: both roofline sides are the fit's slope.

        :class:`PerfModel`'s ``iteration_time`` and ``segment_time`` then give
        ``fixed + slope * context`` and its exact sum, with ``fixed`` from :meth:`_fixed_time`.
        The measured per-sequence cost is compute, so it counts every query token:
        the fixed part at ``batch * (k + 1)`` sequences. Attention is costed as
        ``k + 1`` queries over each context: on the CPU build it is compute, not a
        read shared by the queries (the conservative choice for speculation).
        """
        slope = self._decode(batch, tp)[1] * (draft_tokens + 1)
        return 0.0, slope, 0.0, slope

    def prefill_time(self, tokens: int, tp: int) -> float:
        fit = self.profile.prefill.get(tp)
        if fit is None:
            self._decode(1, tp)  # raises the sentence naming the profiled TP degrees
            return 0.0
        return fit.time(tokens)

    def decode_work_floor(self, tokens: float, context_sum: float, tp: int) -> float:
        """GPU-seconds at least spent decoding ``tokens`` whose contexts sum to ``context_sum``.

        Each token's share of an iteration of ``b`` is ``fixed[b]/b`` plus its own
        context times the slope; the cheapest batch up to the cap bounds both.
        """
        shares = [self._decode(b, tp) for b in range(1, self.batch_cap + 1)]
        per_token = min(f / b for b, (f, _) in enumerate(shares, start=1))
        per_context = min(g for _, g in shares)
        return tp * (tokens * per_token + context_sum * per_context)
