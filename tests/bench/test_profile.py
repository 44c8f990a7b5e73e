"""``heddle bench profile``'s arithmetic on the rollout-shaped load (no workers needed)."""

from __future__ import annotations

import re

import pytest

from heddle.bench._profile import (
    DEFAULT_BATCHES,
    DEFAULT_CONTEXTS,
    DEFAULT_PREFILLS,
    DEFAULT_ROLLOUT_TRAJECTORIES,
    ProfileGrid,
    _overhead_summary,
    profile_grid,
    rollout_per_worker,
    rollout_scales,
)
from heddle.exceptions import ConfigError
from heddle.scheduler import DecodeFit, PrefillFit


def _step(
    tokens: int,
    context: int,
    in_flight: int,
    decode_s: float,
    prefill_s: float,
    *,
    end_s: float = 100.0,
    worker: int = 0,
    uncached: int = 100,
) -> dict[str, float]:
    """A rollout-shaped step's record as the profile's driver writes it."""
    return {
        "worker": float(worker), "end_s": end_s,
        "in_flight": float(in_flight), "tokens": float(tokens), "context_tokens": float(context),
        "uncached_tokens": float(uncached), "prefill_s": prefill_s, "decode_s": decode_s,
        "outside_engine_s": 0.1, "http_s": 0.05, "worker_s": 0.01,
        "engine_frontend_s": 0.04, "queue_s": 1.0,
    }  # fmt: skip


DECODE = DecodeFit((1, 2, 8), (0.004, 0.005, 0.008), (1e-6, 1e-6, 1e-6))
PREFILL = PrefillFit(0.002, 1e-5)


def _iteration(batch: int, context: int, tokens: int) -> float:
    fixed, slope = DECODE.at(batch)
    return fixed + slope * batch * (context - tokens / 2)


def test_decode_is_compared_at_the_batch_whose_decode_overlapped() -> None:
    # Two steps decoding over the same second on worker 0: batch 2.
    per_iteration = _iteration(2, 500, 100)
    pair = [_step(100, 500, 9, 2 * 99 * per_iteration, 0.0, uncached=0) for _ in range(2)]
    # The same second on worker 1: another engine, not part of that batch.
    alone = _step(100, 500, 9, 99 * _iteration(1, 500, 100), 0.0, worker=1, uncached=0)
    got = rollout_scales([*pair, alone], DECODE, PREFILL, batch_cap=8)
    # The pair ran twice the batch-2 fit, the lone step its batch-1 fit.
    alone_s = alone["decode_s"]
    assert got["decode_scale"] == pytest.approx(
        (2 * pair[0]["decode_s"] + alone_s) / (2 * 99 * per_iteration + alone_s)
    )
    capped = rollout_scales(pair, DECODE, PREFILL, batch_cap=1)
    assert capped["decode_scale"] == pytest.approx(2 * per_iteration / _iteration(1, 500, 100))


def test_a_prefill_admitted_during_a_steps_decode_is_part_of_its_fitted_time() -> None:
    # The simulator stalls the running batch for an admission's prefill; vLLM mixes it into
    # the running batch's iterations. The ratio must not count it twice.
    iteration = _iteration(1, 500, 100)
    stall = PREFILL.time(400)
    running = _step(100, 500, 1, 99 * iteration + stall, 0.0, end_s=10.0, uncached=0)
    # A one-token step whose first token (and prefill) came in the middle of that decode.
    joiner = _step(1, 400, 2, 0.0, stall, end_s=10.0 - 0.5 * running["decode_s"], uncached=400)
    got = rollout_scales([running, joiner], DECODE, PREFILL, batch_cap=8)
    assert got["decode_scale"] == pytest.approx(1.0)
    assert got["first_token_over_prefill_fit"] == pytest.approx(1.0)
    # The same prefill after the decode ended charges nothing to it.
    late = _step(1, 400, 2, 0.0, stall, end_s=11.0, uncached=400)
    assert rollout_scales([running, late], DECODE, PREFILL, 8)["decode_scale"] == pytest.approx(
        (99 * iteration + stall) / (99 * iteration)
    )


def test_scales_are_ratios_of_sums_and_one_without_steps() -> None:
    per_iteration = _iteration(1, 500, 100)
    steps = [_step(100, 500, 1, 2 * 99 * per_iteration, 3 * PREFILL.time(100))]
    # One token: no iteration to compare; it still counts for prefill.
    steps.append(_step(1, 300, 1, 0.0, 3 * PREFILL.time(100), end_s=50.0))
    got = rollout_scales(steps, DECODE, PREFILL, batch_cap=8)
    assert got["decode_scale"] == pytest.approx(2.0)
    assert got["first_token_over_prefill_fit"] == pytest.approx(3.0)
    empty = rollout_scales([], DECODE, PREFILL, 8)
    assert empty == {"decode_scale": 1.0, "first_token_over_prefill_fit": 1.0}


def test_the_overhead_summary_takes_the_mean_and_says_where_it_went() -> None:
    steps = [_step(10, 100, 1, 0.1, 0.01) for _ in range(3)]
    steps[0]["outside_engine_s"] = 0.7  # a long tail: the mean is what a makespan adds up
    summary = _overhead_summary([0.02, 0.03, 0.04], steps, 32, 20.0)
    assert summary["rollout_mean_s"] == pytest.approx(0.3)
    assert summary["rollout_median_s"] == pytest.approx(0.1)
    assert summary["isolated_median_s"] == pytest.approx(0.03)
    assert summary["rollout_parts_mean_s"]["http_s"] == pytest.approx(0.05)
    assert summary["rollout_steps"] == 3 and summary["rollout_trajectories_per_worker"] == 32


def test_the_grid_times_batches_up_to_the_cap_and_the_contexts_asked_for() -> None:
    assert profile_grid(8, None, None) == ProfileGrid(
        DEFAULT_BATCHES, DEFAULT_CONTEXTS, DEFAULT_PREFILLS
    )
    grid = profile_grid(6, "1024,64,512,64", "32,256")
    assert grid == ProfileGrid((1, 2, 4, 6), (64, 512, 1024), (32, 256))
    assert profile_grid(1, None, None).batches == (1,)


@pytest.mark.parametrize(
    ("cap", "contexts", "prefills", "says"),
    [
        (0, None, None, "--max-num-seqs 0: write a whole number from 1"),
        (4, "64,lots", None, "--profile-contexts '64,lots': write token counts from 1"),
        (4, None, "0,32", "--profile-prefills '0,32': write token counts from 1"),
    ],
)
def test_a_bad_grid_is_one_sentence_before_any_worker_starts(
    cap: int, contexts: str | None, prefills: str | None, says: str
) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(says)):
        profile_grid(cap, contexts, prefills)


def test_the_rollout_shaped_load_runs_the_rollouts_trajectories_over_the_workers() -> None:
    # bench profile alone: the fidelity workload's 64, 32 per worker.
    assert rollout_per_worker(None, None, 2) == DEFAULT_ROLLOUT_TRAJECTORIES // 2 == 32
    # bench fidelity: the workload's (24 trajectories of engines-tail-small).
    assert rollout_per_worker(None, 24, 2) == 12
    # --trajectories wins, and an odd count rounds up.
    assert rollout_per_worker(25, 24, 2) == 13


def test_a_bad_rollout_size_is_one_sentence() -> None:
    with pytest.raises(ConfigError, match=r"^--trajectories 0: write the rollout's trajectories"):
        rollout_per_worker(0, 24, 2)
