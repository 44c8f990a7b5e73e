"""The predictor's update rules, its learning, and its quality on a real workload."""

from __future__ import annotations

from typing import Any

import pytest

from heddle.exceptions import ConfigError
from heddle.rollout import load_workload
from heddle.scheduler import (
    FinishedTrajectory,
    OraclePredictor,
    Prediction,
    PredictorConfig,
    ProgressPredictor,
    SiblingPredictor,
    Trajectory,
    evaluate_predictor,
    generate,
    history_of,
)


def step(p: SiblingPredictor, t: Trajectory, tokens: int) -> float:
    t.generated_tokens += tokens
    t.turns += 1
    t.turn_tokens.append(tokens)
    return p.update(t).total_tokens


def test_outliving_expectations_raises_the_prediction() -> None:
    p = SiblingPredictor()
    t = Trajectory("t", "g", 500)
    totals = [step(p, t, 2000) for _ in range(8)]
    assert totals == sorted(totals) and totals[-1] > totals[0]
    assert all(
        total >= t_tokens for total, t_tokens in zip(totals, range(2000, 16001, 2000), strict=True)
    )


def test_remaining_is_never_negative_and_capped_by_max_tokens() -> None:
    p = SiblingPredictor(PredictorConfig(max_tokens=10_000))
    t = Trajectory("t", "g", 500)
    step(p, t, 9_999)
    prediction = p.predict(t)
    assert 0.0 <= prediction.remaining_tokens <= 1.0
    assert prediction.total_tokens <= 10_000


def test_long_finished_siblings_raise_a_trajectorys_prediction() -> None:
    def with_siblings(sibling_tokens: int) -> float:
        p = SiblingPredictor()
        for i in range(6):
            s = Trajectory(f"s{i}", "g", 500)
            s.generated_tokens, s.turns, s.turn_tokens = (
                sibling_tokens,
                3,
                [sibling_tokens // 3] * 3,
            )
            p.observe(s)
            p.finish(s)
        t = Trajectory("t", "g", 500)
        return step(p, t, 300)

    assert with_siblings(20_000) > 2 * with_siblings(1_000)


def test_running_siblings_bound_the_group_from_below() -> None:
    p = SiblingPredictor()
    t = Trajectory("t", "g", 500)
    alone = step(p, t, 300)
    for i in range(8):
        s = Trajectory(f"s{i}", "g", 500)
        s.generated_tokens, s.turns = 15_000, 1
        p.observe(s)
    assert p.predict(t).total_tokens > alone


def test_progress_predictor_ignores_siblings() -> None:
    p = ProgressPredictor()
    t = Trajectory("t", "g", 500)
    alone = step(p, t, 300)
    for i in range(6):
        s = Trajectory(f"s{i}", "g", 500)
        s.generated_tokens, s.turns = 20_000, 2
        p.observe(s)
        p.finish(s)
    assert p.predict(t).total_tokens == pytest.approx(alone)


def test_seeding_learns_the_hyperparameters() -> None:
    history = [
        FinishedTrajectory(f"g{g}", 400, 1000 * (g % 4 + 1) + 10 * s, 3, (300, 300, 400))
        for g in range(40)
        for s in range(8)
    ]
    p = SiblingPredictor()
    before = p.hyperparameters
    p.seed(history)
    after = p.hyperparameters
    assert after["intercept"] != before["intercept"]
    assert after["sigma"] < 0.1  # siblings here differ by a few tokens only
    with pytest.raises(ConfigError, match="total_tokens=0"):
        p.seed([FinishedTrajectory("g", 1, 0, 1)])


def test_online_learning_refits_from_complete_groups() -> None:
    p = SiblingPredictor(PredictorConfig(min_complete_groups=3))
    before = p.hyperparameters["intercept"]
    for g in range(4):
        members = [Trajectory(f"g{g}s{i}", f"g{g}", 100) for i in range(4)]
        for m in members:
            p.observe(m)
        for m in members:
            m.generated_tokens, m.turns, m.turn_tokens = 200, 1, [200]
            p.finish(m)
    assert p.hyperparameters["intercept"] < before  # learnt that these run short


def test_invalid_config_is_refused() -> None:
    with pytest.raises(ConfigError, match="prior_median_tokens=0"):
        PredictorConfig(prior_median_tokens=0)
    with pytest.raises(ConfigError, match="grid_points=2"):
        PredictorConfig(grid_points=2)


def test_oracle_knows_the_truth() -> None:
    p = OraclePredictor(lambda t: (1000, 4))
    t = Trajectory("t", "g", 10, generated_tokens=400, turns=1)
    assert p.update(t).remaining_tokens == 600 and t.predicted_remaining_turns == 3


@pytest.mark.slow
def test_siblings_beat_progress_alone_on_the_coding_workload() -> None:
    """A scaled-down coding workload; both predictors seeded from an earlier rollout."""
    spec = load_workload("coding")
    from dataclasses import replace

    small = replace(spec, prompts=96)
    scripts, previous = generate(small, 1), history_of(generate(small, 2))
    scores = {}
    for cls in (SiblingPredictor, ProgressPredictor):
        predictor = cls()
        predictor.seed(previous)
        scores[cls.name] = {q.step: q for q in evaluate_predictor(scripts, predictor, (1, 2, 4))}
    for k in (1, 2):
        assert scores["sibling"][k].pearson_all > scores["progress"][k].pearson_all
    assert scores["sibling"][2].pearson_all > 0.6
    assert scores["sibling"][4].tail_recall_all > scores["sibling"][1].tail_recall_all


def test_one_trajectorys_evidence_is_the_batch_forms_bit_for_bit() -> None:
    """The per-step scalar path (_member) against the batch form the posterior uses."""
    import numpy as np

    history = [
        FinishedTrajectory(f"g{g}", 400, 900 * (g % 5 + 1) + 37 * s, 3 + s % 4, (300, 250, 400))
        for g in range(40)
        for s in range(8)
    ]
    p = SiblingPredictor()
    for seeded in (False, True):  # without, then with, the step-length (rate) model
        if seeded:
            p.seed(history)
        grid = p._posterior(p._group(Trajectory("x", "g0", 400)))[0]
        for tokens, turns in [(0, 0), (0, 1), (5, 0), (1, 1), (777, 2), (3000, 5), (40000, 30)]:
            _, evidence, mean, sd = p._member(grid, (tokens, turns))
            batch = p._evidence(grid, np.array([tokens]), np.array([turns]))
            for got, want in zip((evidence, mean, sd), batch, strict=True):
                assert got.tobytes() == np.ascontiguousarray(want[:, 0]).tobytes()


def test_for_budget_scales_the_prior_with_the_jobs_cap() -> None:
    paper = PredictorConfig()
    assert PredictorConfig.for_budget(paper.max_tokens) == paper
    small = PredictorConfig.for_budget(1500)
    assert small.max_tokens == 1500
    assert small.prior_median_tokens == pytest.approx(150.0)
    large = PredictorConfig.for_budget(200_000)  # a bigger cap does not raise the median
    assert (large.prior_median_tokens, large.max_tokens) == (paper.prior_median_tokens, 200_000)
    with pytest.raises(ConfigError, match="max_total_tokens=0"):
        PredictorConfig.for_budget(0)


def _remaining_before_any_refit(config: PredictorConfig) -> dict[str, float]:
    """The engines-tail bench's first minute: four groups of four, nothing finished; one
    trajectory wrote 78 then 292 tokens (the run's 1,466-token tail), others one or two
    short turns, the rest have not started."""
    p = SiblingPredictor(config)
    trajs = {
        f"g{g}-s{s}": Trajectory(f"g{g}-s{s}", f"g{g}", 120) for g in range(4) for s in range(4)
    }
    for t in trajs.values():
        p.update(t)
    for name, turns in {"g0-s0": [78, 292], "g1-s0": [40], "g2-s0": [40, 30]}.items():
        t = trajs[name]
        t.turn_tokens, t.generated_tokens, t.turns = list(turns), sum(turns), len(turns)
        p.update(t)
    return {
        "tail": trajs["g0-s0"].predicted_remaining_tokens,
        "short": max(trajs[n].predicted_remaining_tokens for n in ("g1-s0", "g2-s0")),
        "fresh": trajs["g3-s0"].predicted_remaining_tokens,
    }


def test_a_prior_at_the_jobs_scale_ranks_the_tail_first_before_any_refit() -> None:
    # Progressive priority runs the longest predicted remaining first; on vLLM with a
    # batch cap the lowest-ranked step queues behind all others.
    at_scale = _remaining_before_any_refit(PredictorConfig.for_budget(1500))
    assert at_scale["tail"] > at_scale["fresh"] > 0
    assert at_scale["tail"] > at_scale["short"]
    # The regression this guards against: the paper's prior under a 1,500-token cap
    # predicts about "cap minus generated", so the tail ranked last.
    paper = _remaining_before_any_refit(PredictorConfig(max_tokens=1500))
    assert paper["tail"] < paper["short"] < paper["fresh"]


def test_a_members_cached_tail_gives_the_uncached_prediction_bit_for_bit() -> None:
    """The per-member tail kept between predictions (progress unchanged, siblings moved)
    against the same predictor recomputing it every time, over steps, tool-call
    re-predictions, finishes and online refits (which rebuild every posterior)."""
    import random

    class Uncached(SiblingPredictor):
        def _predict(self, trajectory: Trajectory, group: Any) -> Prediction:
            group.member_tail.clear()
            return super()._predict(trajectory, group)

    rng = random.Random(7)
    cached, uncached = (
        SiblingPredictor(PredictorConfig(min_complete_groups=2)),
        Uncached(PredictorConfig(min_complete_groups=2)),
    )
    pairs = {
        f"g{g}s{s}": (
            Trajectory(f"g{g}s{s}", f"g{g}", 300 + g),
            Trajectory(f"g{g}s{s}", f"g{g}", 300 + g),
        )
        for g in range(12)
        for s in range(4)
    }
    live, refits_before = list(pairs), cached._fitted_on
    compared = 0
    while live:
        tid = rng.choice(live)
        a, b = pairs[tid]
        if rng.random() < 0.6:  # a step: progress, then the prediction after it
            tokens = rng.randint(1, 900)
            for t in (a, b):
                t.generated_tokens += tokens
                t.turns += 1
                t.turn_tokens.append(tokens)
        if a.turns >= 2 and rng.random() < 0.25:
            cached.finish(a)
            uncached.finish(b)
            live.remove(tid)
            continue
        # Without a step this is the re-prediction after a tool call.
        got, want = cached.update(a), uncached.update(b)
        assert got == want
        compared += 1
    assert compared > 100 and cached._fitted_on > refits_before  # refits happened
