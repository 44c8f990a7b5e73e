"""K from measured acceptance (heddle.scheduler.MeasuredKTable): the fit, the rebuilt
table, and how it follows an acceptance that changes."""

from __future__ import annotations

import itertools
import json

import pytest

from heddle.exceptions import ConfigError
from heddle.scheduler import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    KTableSettings,
    MeasuredKTable,
    PerfModel,
    auto_k_table,
    fit_alpha,
    geometric_tokens_per_step,
    k_by_batch_size,
)

# Qwen3-14B on an H100 at a batch cap of 100: the tables' clusters (docs/speculation.md).
PERF = PerfModel(MODEL_PRESETS["qwen3-14b"], HARDWARE_PRESETS["h100-sxm"], batch_cap=100)
FAST = KTableSettings(rebuild_every_steps=100)


def table(settings: KTableSettings = FAST, max_k: int = 4) -> MeasuredKTable:
    return MeasuredKTable(PERF, 4, "suffix", max_num_seqs=100, max_k=max_k, settings=settings)


def feed(t: MeasuredKTable, alpha: float, steps: int, k: int | None = None) -> None:
    """``steps`` request-steps at ``k`` (the table's K at a batch of one) giving what a
    geometric acceptance ``alpha`` gives, in chunks of 10."""
    for _ in range(steps // 10):
        at = k or max(1, t.k_at(1))
        t.record(at, 10, 10 * geometric_tokens_per_step(alpha, at))


class TestFit:
    @pytest.mark.parametrize("alpha", [0.05, 0.3, 0.55, 0.9])
    def test_recovers_the_acceptance_from_steps_at_several_ks(self, alpha: float) -> None:
        steps = {1: 50.0, 2: 300.0, 4: 120.0}
        tokens = {k: n * geometric_tokens_per_step(alpha, k) for k, n in steps.items()}
        assert fit_alpha(steps, tokens) == pytest.approx(alpha, abs=1e-6)

    def test_steps_that_gave_one_token_each_fit_zero_and_all_taken_fit_one(self) -> None:
        assert fit_alpha({3: 40.0}, {3: 40.0}) == 0.0
        assert fit_alpha({3: 40.0}, {3: 160.0}) == 1.0

    def test_nothing_drafted_is_a_clear_error(self) -> None:
        with pytest.raises(ConfigError, match="no request-step drafted"):
            fit_alpha({0: 10.0}, {0: 10.0})

    @pytest.mark.parametrize(
        ("field", "value", "words"),
        [
            ("rebuild_every_steps", 0, "rebuild_every_steps=0"),
            ("decay", 1.5, "decay=1.5"),
            ("alpha_resolution", 0.0, "alpha_resolution=0.0"),
            ("prior_steps", -1.0, "prior_steps=-1.0"),
        ],
    )
    def test_settings_out_of_range_say_which(self, field: str, value: float, words: str) -> None:
        with pytest.raises(ConfigError, match=words):
            KTableSettings(**{field: value})  # type: ignore[arg-type]


class TestRebuilt:
    def test_starts_as_the_table_an_auto_worker_builds(self) -> None:
        t = table()
        assert t.table == auto_k_table(PERF, 4, "suffix", max_num_seqs=100)
        assert t.alpha is None and t.rebuilds == 0

    def test_drafts_more_where_drafts_are_taken_more_than_assumed(self) -> None:
        t = table()
        start = t.table
        feed(t, 0.6, 1000)
        assert t.rebuilds >= 5 and t.alpha == pytest.approx(0.6, abs=0.03)
        want = k_by_batch_size(
            PERF, 4, 1024.0, lambda k: geometric_tokens_per_step(t.alpha or 0, k), 100,
            (1, 2, 3, 4),
        )  # fmt: skip
        assert t.table == want
        for batch in (1, 8, 32, 64):
            assert t.k_at(batch) >= _k(start, batch)
        assert sum(t.k_at(b) for b in range(1, 101)) > sum(_k(start, b) for b in range(1, 101))

    def test_turns_off_where_drafts_are_not_taken_but_keeps_measuring(self) -> None:
        t = table()
        feed(t, 0.0, 1000)
        assert t.alpha == 0.0
        # Never slower than without speculation, except one K at a batch of one, so that
        # an acceptance that rises again is seen.
        assert t.k_at(1) == 1 and all(t.k_at(b) == 0 for b in range(2, 101))

    def test_follows_an_acceptance_that_changes(self) -> None:
        # Older counts fade at each rebuild: a rollout whose siblings' texts arrive late
        # drafts by what its drafts give now, within a few rebuilds.
        t = table()
        feed(t, 0.1, 1000)
        low = t.alpha
        feed(t, 0.7, 800)
        assert low is not None and low < 0.15
        assert t.alpha == pytest.approx(0.7, abs=0.05)

    def test_a_few_steps_do_not_swing_it_far_from_the_assumed_acceptance(self) -> None:
        # The assumed acceptance counts as prior_steps request-steps: one rebuild on 100
        # steps that took every draft lands between it and 1, not at 1.
        t = table(KTableSettings(rebuild_every_steps=100, prior_steps=256))
        t.record(4, 100, 500)
        assert t.alpha is not None and 0.3 < t.alpha < 0.9

    def test_k_is_never_above_the_largest_and_counts_above_it_are_clamped(self) -> None:
        t = table(KTableSettings(rebuild_every_steps=100, prior_steps=0), max_k=2)
        t.record(6, 100, 700)  # asked more than the largest K: counted at K=2, at most 3 each
        assert t.alpha == 1.0
        assert max(k for _, k in t.table) == 2

    def test_state_is_json_and_covers_every_batch_size(self) -> None:
        t = table()
        feed(t, 0.5, 300)
        state = json.loads(json.dumps(t.state()))
        rows = state["by_batch_size"]
        assert rows[0][0] == 1 and rows[-1][1] == 100
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(rows))
        assert state["format"] == "heddle.k-table/v1" and state["rebuilds"] == t.rebuilds
        assert state["measured_steps"] == 300
        assert state["measured_tokens_per_step"] == pytest.approx(
            geometric_tokens_per_step(0.5, t.k_at(1)), rel=0.2
        )

    def test_engines_of_a_pool_share_built_tables(self) -> None:
        cache: dict[tuple[int, int, int, float, float], tuple[tuple[int, int], ...]] = {}
        a = MeasuredKTable(PERF, 4, "suffix", max_num_seqs=100, settings=FAST, cache=cache)
        b = MeasuredKTable(PERF, 4, "suffix", max_num_seqs=100, settings=FAST, cache=cache)
        feed(a, 0.5, 100, k=2)
        feed(b, 0.5, 100, k=2)
        assert a.table is b.table and len(cache) == 1


def _k(rows: tuple[tuple[int, int], ...], batch: int) -> int:
    return next(k for up_to, k in rows if batch <= up_to)
