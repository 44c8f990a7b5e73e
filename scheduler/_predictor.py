"""Runtime predictors of a trajectory's *remaining* length.

The sibling-aware predictor models log total output length hierarchically::

    log T   = mu_group + eps,    eps ~ N(0, sigma²)
    mu_group ~ N(a + b * log prompt_tokens, tau²)
    r_k     = log(tokens after k steps / k) ~ N(c_k + d_k * log T, v_k)

A group's posterior over ``mu_group`` (on a grid) combines the prior with
every GRPO sibling: finished ones give their exact length, running ones a
lower bound, their tokens so far (a censored observation). The trajectory's
own evidence is its lower bound and its mean step length so far ``r_k``
(long trajectories take long steps early). The prediction is the posterior
mean of ``T`` given ``T > tokens so far``; it grows as a trajectory outlives
expectations. ``progress`` is the same model blind to siblings (the paper's
information set).

Hyperparameters come from earlier rollouts (:meth:`LengthPredictor.seed`) and
are refitted online from groups whose samples have all finished. Early in a
rollout the complete groups are the short ones, so the length hierarchy
(median, spreads) learns from them only once half the groups seen are
complete; the step-length and turn models condition on the length itself,
which selection by length does not bias, so they learn at once.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import ClassVar

import numpy as np

from heddle.exceptions import ConfigError

from ._stats import log_normal_sf
from ._types import FinishedTrajectory, Trajectory

__all__ = [
    "LengthPredictor",
    "OraclePredictor",
    "Prediction",
    "PredictorConfig",
    "ProgressPredictor",
    "SiblingPredictor",
]

_RATE_STEPS = 8  # steps with their own rate model; later steps share the last one
_MIN_RATE_SAMPLES = 30


@dataclass(frozen=True)
class PredictorConfig:
    """Priors used until data arrives, and the model's resolution."""

    prior_median_tokens: float = 4096.0  # median output tokens of a trajectory
    prior_group_sigma: float = 0.8  # SD of log length between prompts
    prior_within_sigma: float = 0.7  # SD of log length among samples of one prompt
    prior_median_turns: float = 6.0
    max_tokens: int = 40960  # no trajectory outgrows the job's maxTotalTokens
    grid_points: int = 40
    min_complete_groups: int = 8  # complete groups before refitting online
    use_siblings: bool = True

    def __post_init__(self) -> None:
        for name in (
            "prior_median_tokens",
            "prior_group_sigma",
            "prior_within_sigma",
            "prior_median_turns",
        ):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"PredictorConfig.{name}={value} must be > 0")
        if self.max_tokens < 1:
            raise ConfigError(f"PredictorConfig.max_tokens={self.max_tokens} must be >= 1")
        if self.grid_points < 8:
            raise ConfigError(f"PredictorConfig.grid_points={self.grid_points} must be >= 8")

    @classmethod
    def for_budget(cls, max_total_tokens: int) -> PredictorConfig:
        """The priors for a job whose trajectories stop at ``max_total_tokens``.

        The defaults are the paper's coding job (median 4,096 of a 40,960-token cap).
        A smaller budget scales the prior median down with it, so the ratio stays, and
        caps every prediction at the budget. Why: with the paper's prior on a job capped
        at 1,500 tokens, every prediction before the first refit is about the cap minus
        what was generated, so the trajectory that has written the most ranks *last*
        and fresh ones first: on vLLM with a batch cap, the tail's steps queued behind
        every other step (docs/speculation.md, "Real engines"). A prior at the job's
        scale lets progress raise a trajectory's predicted remaining length, as a
        long-tailed length distribution says it should. A larger budget keeps the
        default median (only the cap grows).
        """
        if max_total_tokens < 1:
            raise ConfigError(f"max_total_tokens={max_total_tokens} must be >= 1")
        base = cls()
        ratio = base.prior_median_tokens / base.max_tokens
        median = min(base.prior_median_tokens, ratio * max_total_tokens)
        return cls(prior_median_tokens=max(1.0, median), max_tokens=max_total_tokens)


@dataclass(frozen=True)
class Prediction:
    remaining_tokens: float
    remaining_turns: float
    total_tokens: float


class LengthPredictor(ABC):
    """Predicts remaining length; told about progress and finishes as they happen."""

    name: ClassVar[str]

    def seed(self, history: Iterable[FinishedTrajectory]) -> None:  # noqa: B027
        """Learn from an earlier rollout's finished trajectories (optional)."""

    def observe(self, trajectory: Trajectory) -> None:  # noqa: B027
        """A step or tool result changed the trajectory's progress."""

    def finish(self, trajectory: Trajectory) -> None:  # noqa: B027
        """The trajectory finished; its length is now known."""

    @abstractmethod
    def predict(self, trajectory: Trajectory) -> Prediction: ...

    def update(self, trajectory: Trajectory) -> Prediction:
        """Observe progress, predict, and store the prediction on the trajectory."""
        self.observe(trajectory)
        prediction = self.predict(trajectory)
        trajectory.predicted_remaining_tokens = prediction.remaining_tokens
        trajectory.predicted_remaining_turns = prediction.remaining_turns
        return prediction


@dataclass
class _Group:
    """One prompt's samples and the posterior over its mu (kept up to date incrementally)."""

    prompt_tokens: int
    finished: list[float] = field(default_factory=list)  # log total tokens
    live: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (tokens, turns)
    grid: np.ndarray | None = None  # None: rebuild the posterior before use
    log_w: np.ndarray | None = None
    # id -> (progress, log evidence, mean, sd) of a running member, as last folded into log_w
    member_evidence: dict[str, tuple[tuple[int, int], np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=dict
    )

    # id -> (progress, exp(log E[T | mu, T > tokens] - top), top) of a running member on
    # this grid: what a prediction weighs by the posterior. It depends on the member's own
    # progress only, so the re-prediction after a tool call (siblings moved, it did not)
    # reuses it; the posterior's weights are all that changed.
    member_tail: dict[str, tuple[tuple[int, int], np.ndarray, float]] = field(default_factory=dict)

    version: int = 0  # bumped whenever the group's evidence changes (prediction cache key)

    def invalidate(self) -> None:
        self.grid = self.log_w = None
        self.member_evidence.clear()
        self.member_tail.clear()
        self.version += 1


@dataclass(frozen=True)
class _Hyper:
    intercept: float
    slope: float  # of the group mean on log prompt tokens
    tau: float
    sigma: float
    turns_intercept: float
    turns_slope: float  # log turns on log total tokens
    rate: tuple[tuple[float, float, float], ...] = ()  # (c_k, d_k, v_k) for k = 1, 2, ...


def _fit_rate(records: list[FinishedTrajectory]) -> tuple[tuple[float, float, float], ...]:
    """Per step k: log(mean step length so far) on log total, over trajectories alive at k."""
    # Each record's log length and step-length prefix sums once, not once per k:
    # a refit runs over every record so far (the same numbers: integer sums).
    rows = [
        (
            math.log(r.total_tokens),
            len(r.turn_tokens),
            list(accumulate(r.turn_tokens[:_RATE_STEPS])),
        )
        for r in records
        if len(r.turn_tokens) > 1
    ]
    fitted: list[tuple[float, float, float]] = []
    for k in range(1, _RATE_STEPS + 1):
        pairs = [
            (log_total, math.log(max(1, prefix[k - 1]) / k))
            for log_total, steps, prefix in rows
            if steps > k
        ]
        if len(pairs) < _MIN_RATE_SAMPLES:
            break
        x, y = np.array(pairs).T
        if x.std() < 1e-6:
            break
        d, c = np.polyfit(x, y, 1)
        v = float(np.var(y - (c + d * x))) + 1e-4
        fitted.append((float(c), float(d), v))
    return tuple(fitted)


class SiblingPredictor(LengthPredictor):
    """Heddle's predictor: progress, step lengths and GRPO siblings, learnt online."""

    name = "sibling"

    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.config = config or PredictorConfig()
        c = self.config
        self._hyper = _Hyper(
            intercept=math.log(c.prior_median_tokens),
            slope=0.0,
            tau=c.prior_group_sigma,
            sigma=c.prior_within_sigma,
            turns_intercept=math.log(c.prior_median_turns) - 0.5 * math.log(c.prior_median_tokens),
            turns_slope=0.5,
        )
        self._groups: dict[str, _Group] = {}
        self._seeded: list[list[FinishedTrajectory]] = []  # groups from earlier rollouts
        self._complete: list[list[FinishedTrajectory]] = []  # complete groups of this rollout
        self._pending: dict[str, list[FinishedTrajectory]] = {}
        self._fitted_on = 0
        # id -> ((tokens, turns, group version), prediction): a tool result alone
        # changes nothing the model sees, so re-predicting after it is free.
        self._cache: dict[str, tuple[tuple[int, int, int], Prediction]] = {}
        self._unit_grid = np.linspace(-4.0, 4.0, c.grid_points)  # the posterior's, before scaling

    @property
    def hyperparameters(self) -> dict[str, object]:
        return dict(vars(self._hyper))

    # -- learning ---------------------------------------------------------------
    def seed(self, history: Iterable[FinishedTrajectory]) -> None:
        by_group: dict[str, list[FinishedTrajectory]] = {}
        for record in history:
            if record.total_tokens < 1:
                raise ConfigError(
                    f"seed record of group {record.group_id!r} has total_tokens="
                    f"{record.total_tokens}; finished trajectories have at least 1 token"
                )
            by_group.setdefault(record.group_id, []).append(record)
        self._seeded.extend(by_group.values())
        self._refit()

    def _group(self, trajectory: Trajectory) -> _Group:
        group = self._groups.get(trajectory.group_id)
        if group is None:
            group = self._groups[trajectory.group_id] = _Group(trajectory.prompt_tokens)
        return group

    def observe(self, trajectory: Trajectory) -> None:
        group = self._group(trajectory)
        progress = (trajectory.generated_tokens, trajectory.turns)
        if group.live.get(trajectory.id) == progress:
            return
        group.live[trajectory.id] = progress
        group.version += 1
        if group.grid is not None and group.log_w is not None and self.config.use_siblings:
            entry = self._member(group.grid, progress)
            old = group.member_evidence.get(trajectory.id)
            group.log_w = group.log_w + entry[1] - (0.0 if old is None else old[1])
            group.member_evidence[trajectory.id] = entry

    def finish(self, trajectory: Trajectory) -> None:
        group = self._group(trajectory)
        group.live.pop(trajectory.id, None)
        group.version += 1
        self._cache.pop(trajectory.id, None)
        group.member_tail.pop(trajectory.id, None)
        log_len = math.log(max(1, trajectory.generated_tokens))
        group.finished.append(log_len)
        if group.grid is not None and group.log_w is not None and self.config.use_siblings:
            old = group.member_evidence.pop(trajectory.id, None)
            exact = -0.5 * ((log_len - group.grid) / self._hyper.sigma) ** 2
            group.log_w = group.log_w + exact - (0.0 if old is None else old[1])
        record = FinishedTrajectory(
            trajectory.group_id,
            trajectory.prompt_tokens,
            trajectory.generated_tokens,
            trajectory.turns,
            tuple(trajectory.turn_tokens),
        )
        self._pending.setdefault(trajectory.group_id, []).append(record)
        if not group.live:
            # Every sample seen so far has finished: a complete group.
            self._complete.append(self._pending.pop(trajectory.group_id))
            enough = len(self._complete) >= self.config.min_complete_groups
            # Refit as the data grows by a quarter: O(log n) refits per rollout.
            if enough and len(self._complete) >= 1.25 * self._fitted_on:
                self._refit()

    def _hierarchy_groups(self) -> list[list[FinishedTrajectory]]:
        """Groups the length hierarchy may learn from without a short-first bias."""
        seen = len(self._groups)
        mostly_done = seen > 0 and len(self._complete) >= 0.5 * seen
        return self._seeded + (self._complete if mostly_done else [])

    def _refit(self) -> None:
        """Refit the step-length and turn models, and the hierarchy when it is safe."""
        self._fitted_on = len(self._complete)
        records = [r for g in self._seeded + self._complete for r in g]
        if len(records) < 2:
            return
        h = self._hyper
        logs = np.log(np.maximum(1, np.array([r.total_tokens for r in records])))
        turns = np.log(np.maximum(1, np.array([r.turns for r in records])))
        turns_slope, turns_intercept = h.turns_slope, h.turns_intercept
        if logs.std() > 1e-6:
            turns_slope, turns_intercept = (float(v) for v in np.polyfit(logs, turns, 1))
        rate = _fit_rate(records) or h.rate
        intercept, slope, tau, sigma = h.intercept, h.slope, h.tau, h.sigma
        groups = [g for g in self._hierarchy_groups() if g]
        if len(groups) >= 2:
            intercept, slope, tau, sigma = self._fit_hierarchy(groups)
        self._hyper = _Hyper(intercept, slope, tau, sigma, turns_intercept, turns_slope, rate)
        for group in self._groups.values():
            group.invalidate()

    def _fit_hierarchy(
        self, groups: list[list[FinishedTrajectory]]
    ) -> tuple[float, float, float, float]:
        """Method-of-moments fit of (intercept, slope, tau, sigma) from complete groups."""
        sizes = np.array([len(g) for g in groups])
        logs = np.log(np.maximum(1, np.array([r.total_tokens for g in groups for r in g])))
        owner = np.repeat(np.arange(len(groups)), sizes)
        means = np.bincount(owner, weights=logs) / sizes
        dof = int((sizes - 1).sum())
        within_ss = float(((logs - means[owner]) ** 2).sum())
        sigma = math.sqrt(within_ss / dof) if dof > 0 else self._hyper.sigma
        log_prompt = np.log(np.maximum(1, np.array([g[0].prompt_tokens for g in groups])))
        slope = 0.0
        if log_prompt.std() > 1e-6:
            slope = float(np.polyfit(log_prompt, means, 1)[0])
        intercept = float((means - slope * log_prompt).mean())
        residual = means - intercept - slope * log_prompt
        between = float(residual.var()) - sigma**2 * float((1.0 / sizes).mean())
        return intercept, slope, math.sqrt(max(between, 0.01)), max(sigma, 0.05)

    # -- inference --------------------------------------------------------------
    def _evidence(
        self, grid: np.ndarray, tokens: np.ndarray, turns: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What running trajectories say about mu_group, per grid point and trajectory.

        Returns (log evidence, mean, sd) of shape (grid, trajectories): the
        log likelihood of a trajectory's step lengths and lower bound given
        mu_group, and the Gaussian of its log T given mu_group and its step
        lengths (before the lower bound).
        """
        h = self._hyper
        shape = (grid.size, tokens.size)
        mean = np.broadcast_to(grid[:, None], shape).copy()
        sd = np.full(shape, h.sigma)
        log_ev = np.zeros(shape)
        log_g = np.log(np.maximum(tokens, 1))
        if h.rate:
            steps = np.minimum(turns, len(h.rate))
            with_rate = (turns >= 1) & (tokens > 0)
            if with_rate.any():
                params = np.array(h.rate)[np.maximum(steps, 1) - 1]
                c, d, v = params[:, 0], params[:, 1], params[:, 2]
                r = log_g - np.log(np.maximum(turns, 1))
                precision = 1.0 / h.sigma**2 + d * d / v
                m = (grid[:, None] / h.sigma**2 + d * (r - c) / v) / precision
                mean = np.where(with_rate, m, mean)
                sd = np.where(with_rate, np.sqrt(1.0 / precision), sd)
                spread = v + d * d * h.sigma**2
                log_ev = np.where(with_rate, -0.5 * (r - c - d * grid[:, None]) ** 2 / spread, 0.0)
        bounded = tokens > 0
        survive = log_normal_sf((log_g - mean) / sd)
        return log_ev + np.where(bounded, survive, 0.0), mean, sd

    def _member(
        self, grid: np.ndarray, progress: tuple[int, int]
    ) -> tuple[tuple[int, int], np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_evidence` of one trajectory, the per-step path.

        The trajectory's own terms are scalars here, so only the grid-sized
        arithmetic goes through numpy (its per-call cost is most of the work at
        40 points); every element gets the same operations in the same order as
        in :meth:`_evidence`, so the results are bit for bit the same.
        """
        h = self._hyper
        tokens, turns = progress
        log_g = np.log(max(tokens, 1))
        if h.rate and turns >= 1 and tokens > 0:
            c, d, v = h.rate[min(turns, len(h.rate)) - 1]
            r = log_g - np.log(turns)
            precision = 1.0 / h.sigma**2 + d * d / v
            mean = (grid / h.sigma**2 + d * (r - c) / v) / precision
            sd = np.full(grid.size, np.sqrt(1.0 / precision))
            spread = v + d * d * h.sigma**2
            log_ev = -0.5 * (r - c - d * grid) ** 2 / spread
        else:
            mean, sd, log_ev = grid.copy(), np.full(grid.size, h.sigma), None
        # Without rate evidence the batch form adds zeros: x + 0.0 is x (log_normal_sf is
        # never -0.0), so the sum is skipped.
        if tokens > 0:
            survive = log_normal_sf((log_g - mean) / sd)
            evidence = survive if log_ev is None else log_ev + survive
        else:
            evidence = np.zeros(grid.size) if log_ev is None else log_ev
        return progress, evidence, mean, sd

    def _posterior(self, group: _Group) -> tuple[np.ndarray, np.ndarray]:
        """Grid over mu_group and its log weights, given every sibling (cached)."""
        if group.grid is not None and group.log_w is not None:
            return group.grid, group.log_w
        h = self._hyper
        prior_mean = h.intercept + h.slope * math.log(max(1, group.prompt_tokens))
        grid = prior_mean + h.tau * self._unit_grid
        log_w = -0.5 * ((grid - prior_mean) / h.tau) ** 2
        if self.config.use_siblings:
            if group.finished:
                finished = np.asarray(group.finished)
                log_w += (-0.5 * ((finished[None, :] - grid[:, None]) / h.sigma) ** 2).sum(axis=1)
            if group.live:
                tokens, turns = np.array(list(group.live.values()), dtype=np.int64).T
                evidence, means, sds = self._evidence(grid, tokens, turns)
                log_w += evidence.sum(axis=1)
                # One transposed copy per array: each member's row is a contiguous view
                # (every refit rebuilds the posterior of every running group).
                by_member = zip(evidence.T.copy(), means.T.copy(), sds.T.copy(), strict=True)
                group.member_evidence = {
                    tid: (progress, ev, mean, sd)
                    for (tid, progress), (ev, mean, sd) in zip(
                        group.live.items(), by_member, strict=True
                    )
                }
        group.grid, group.log_w = grid, log_w
        return grid, log_w

    def predict(self, trajectory: Trajectory) -> Prediction:
        group = self._group(trajectory)
        key = (trajectory.generated_tokens, trajectory.turns, group.version)
        cached = self._cache.get(trajectory.id)
        if cached is not None and cached[0] == key:
            return cached[1]
        prediction = self._predict(trajectory, group)
        self._cache[trajectory.id] = (key, prediction)
        return prediction

    def _predict(self, trajectory: Trajectory, group: _Group) -> Prediction:
        h = self._hyper
        grid, log_w = self._posterior(group)
        progress = (trajectory.generated_tokens, trajectory.turns)
        recorded = group.member_evidence.get(trajectory.id)
        if recorded is not None and recorded[0] == progress:
            _, _, mean, sd = recorded  # its evidence is already in the posterior
        else:
            _, own_ev, mean, sd = self._member(grid, progress)
            if recorded is not None:
                log_w = log_w - recorded[1]  # folded in at an older progress
            log_w = log_w + own_ev
        tail = group.member_tail.get(trajectory.id)
        if tail is None or tail[0] != progress:
            tail = group.member_tail[trajectory.id] = self._tail(trajectory, grid, mean, sd)
        _, scaled, top = tail
        weights = np.exp(log_w - log_w.max())
        total = float(scaled @ weights / weights.sum()) * math.exp(top)
        total = min(max(total, float(trajectory.generated_tokens)), float(self.config.max_tokens))
        remaining = max(0.0, total - trajectory.generated_tokens)
        turns_total = math.exp(h.turns_intercept + h.turns_slope * math.log(max(total, 1.0)))
        remaining_turns = max(1.0 if remaining > 0 else 0.0, turns_total - trajectory.turns)
        return Prediction(remaining, remaining_turns, total)

    @staticmethod
    def _tail(
        trajectory: Trajectory, grid: np.ndarray, mean: np.ndarray, sd: np.ndarray
    ) -> tuple[tuple[int, int], np.ndarray, float]:
        """E[T | mu, T > tokens so far] per grid point, scaled by its largest value."""
        z = (math.log(max(1, trajectory.generated_tokens)) - mean) / sd
        if trajectory.generated_tokens == 0:
            z = np.full_like(z, -np.inf)
        tails = log_normal_sf(np.concatenate([z, z - sd]))
        log_survive, log_shifted = tails[: grid.size], tails[grid.size :]
        # E[T | T > g] of a log-normal: exp(m + s²/2) * P(Z > z - s) / P(Z > z)
        log_mean = mean + 0.5 * sd**2 + log_shifted - log_survive
        top = log_mean.max()
        progress = (trajectory.generated_tokens, trajectory.turns)
        return progress, np.exp(log_mean - top), top


class ProgressPredictor(SiblingPredictor):
    """The paper's information set: own progress and history, no siblings."""

    name = "progress"

    def __init__(self, config: PredictorConfig | None = None) -> None:
        super().__init__(replace(config or PredictorConfig(), use_siblings=False))


class OraclePredictor(LengthPredictor):
    """Knows each trajectory's true length; an upper bound for simulations only."""

    name = "oracle"

    def __init__(self, truth: Callable[[Trajectory], tuple[int, int]]) -> None:
        self._truth = truth  # -> (total tokens, total turns)

    def predict(self, trajectory: Trajectory) -> Prediction:
        tokens, turns = self._truth(trajectory)
        return Prediction(
            float(max(0, tokens - trajectory.generated_tokens)),
            float(max(0, turns - trajectory.turns)),
            float(tokens),
        )
