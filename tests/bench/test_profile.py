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
    tokens: int, context: int, in_flight: int, decode_s: float, prefill_s: float
) -> dict[str, float]:
    return {
        "in_flight": float(in_flight), "tokens": float(tokens), "context_tokens": float(context),
        "uncached_tokens": 100.0, "prefill_s": prefill_s, "decode_s": decode_s,
        "outside_engine_s": 0.1, "http_s": 0.05, "worker_s": 0.01,
        "engine_frontend_s": 0.04, "queue_s": 1.0,
    }  # fmt: skip


def test_scales_compare_the_engine_core_with_the_fits_at_the_batch_it_ran() -> None:
    decode = DecodeFit((1, 8), (0.004, 0.008), (1e-6, 1e-6))
    prefill = PrefillFit(0.002, 1e-5)
    # 20 in flight with a cap of 8: batch 8, each of 8 contexts ~ (context - tokens/2).
    per_iteration = 0.008 + 1e-6 * 8 * (500 - 50)
    steps = [_step(100, 500, 20, 2 * 99 * per_iteration, 3 * prefill.time(100))]
    # One token: no iteration to compare; it still counts for prefill.
    steps.append(_step(1, 300, 1, 0.0, 3 * prefill.time(100)))
    got = rollout_scales(steps, decode, prefill, batch_cap=8)
    assert got["decode_scale"] == pytest.approx(2.0)
    assert got["first_token_over_prefill_fit"] == pytest.approx(3.0)
    empty = rollout_scales([], decode, prefill, 8)
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
