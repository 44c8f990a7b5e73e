"""The performance model: monotone where physics says so, and its closed forms exact."""

from __future__ import annotations

import itertools

import pytest

from heddle.exceptions import ConfigError
from heddle.scheduler import HARDWARE_PRESETS, MODEL_PRESETS, PerfModel


def test_more_batch_costs_more_time_per_iteration(perf: PerfModel) -> None:
    times = [perf.iteration_time(b, b * 4096, 1) for b in (1, 2, 8, 32, 100)]
    assert times == sorted(times)
    assert times[-1] > times[0]


def test_more_tp_costs_less_time_per_iteration(perf: PerfModel) -> None:
    for batch in (1, 16, 100):
        times = [perf.iteration_time(batch, batch * 8192, tp) for tp in (1, 2, 4, 8)]
        assert times == sorted(times, reverse=True), (batch, times)


def test_tp_speedup_is_sublinear(perf: PerfModel) -> None:
    """All-reduce and the fixed step overhead keep TP8 from being 8x faster than TP1."""
    speedup = perf.per_token_s(1) / perf.per_token_s(8)
    assert 1.5 < speedup < 8.0


def test_the_h200_reads_faster_than_the_h100_and_computes_the_same() -> None:
    h100 = PerfModel(MODEL_PRESETS["qwen3-14b"], HARDWARE_PRESETS["h100-sxm"])
    h200 = PerfModel(MODEL_PRESETS["qwen3-14b"], HARDWARE_PRESETS["h200-sxm"])
    fixed = HARDWARE_PRESETS["h100-sxm"].step_overhead_ms * 1e-3
    # A lone sequence is memory-bound: the step shrinks by the bandwidth ratio.
    lone = [(p.iteration_time(1, 1024, 1) - fixed) for p in (h100, h200)]
    assert lone[0] / lone[1] == pytest.approx(4800 / 3350)
    # A full batch of short contexts is compute-bound: the same chip, the same step.
    full = [p.iteration_time(256, 256 * 256, 1) for p in (h100, h200)]
    assert full[0] == pytest.approx(full[1])
    # The larger memory holds more KV.
    assert h200.kv_capacity_tokens(1) > 2 * h100.kv_capacity_tokens(1)


@pytest.mark.parametrize(
    "batch,context,iterations", [(1, 100, 1), (7, 5_000, 33), (64, 900_000, 250)]
)
def test_segment_time_equals_sum_of_iterations(
    perf: PerfModel, batch: int, context: int, iterations: int
) -> None:
    for tp in (1, 2, 8):
        stepwise = sum(
            perf.iteration_time(batch, context + i * batch, tp) for i in range(iterations)
        )
        assert perf.segment_time(batch, context, tp, iterations) == pytest.approx(
            stepwise, rel=1e-9
        )


def test_segment_time_across_the_roofline_crossing() -> None:
    """A tiny-context, huge-batch segment crosses from compute- to memory-bound."""
    model = PerfModel(MODEL_PRESETS["qwen3-8b"], HARDWARE_PRESETS["h100-sxm"], batch_cap=512)
    mb, _mc, cb, _cc = model._roofline_terms(512, 1)
    assert cb > mb  # compute-bound at zero context
    stepwise = sum(model.iteration_time(512, i * 512, 1) for i in range(3000))
    assert model.segment_time(512, 0, 1, 3000) == pytest.approx(stepwise, rel=1e-9)


def test_iterations_within_inverts_segment_time(perf: PerfModel) -> None:
    for seconds in (0.0, 0.01, 1.0, 37.5):
        k = perf.iterations_within(16, 50_000, 2, seconds)
        assert perf.segment_time(16, 50_000, 2, k) <= seconds
        assert perf.segment_time(16, 50_000, 2, k + 1) > seconds


def test_kv_capacity_grows_with_tp_and_is_zero_when_weights_do_not_fit() -> None:
    model = PerfModel(MODEL_PRESETS["qwen3-32b"], HARDWARE_PRESETS["h100-sxm"])
    caps = [model.kv_capacity_tokens(tp) for tp in (1, 2, 4, 8)]
    assert caps == sorted(caps) and caps[0] > 0
    tiny = PerfModel(
        MODEL_PRESETS["qwen3-32b"],
        HARDWARE_PRESETS["h100-sxm"].__class__("small", 40.0, 2000.0, 300.0, 100.0),
    )
    assert tiny.kv_capacity_tokens(1) == 0
    with pytest.raises(ConfigError, match="does not fit"):
        tiny.min_tp([1])


def test_instance_interference_starts_at_one_and_never_falls(perf: PerfModel) -> None:
    for tp in (1, 2, 4, 8):
        inst = perf.instance(f"tp{tp}", tp)
        assert inst.interference(1) == pytest.approx(1.0)
        curve = [inst.interference(b) for b in range(1, inst.batch_cap + 40)]
        assert all(b >= a for a, b in itertools.pairwise(curve))
        # Past the cap requests take turns: time grows in proportion.
        cap = inst.batch_cap
        assert inst.interference(2 * cap) == pytest.approx(2 * inst.interference(cap))


def test_prefill_grows_with_tokens_and_shrinks_with_tp(perf: PerfModel) -> None:
    assert perf.prefill_time(0, 1) == 0.0
    assert perf.prefill_time(1000, 1) < perf.prefill_time(20_000, 1)
    assert perf.prefill_time(20_000, 8) < perf.prefill_time(20_000, 1)


def test_invalid_perf_settings_say_what_to_fix() -> None:
    with pytest.raises(ConfigError, match="batch_cap=0 must be at least 1"):
        PerfModel(MODEL_PRESETS["qwen3-8b"], HARDWARE_PRESETS["h100-sxm"], batch_cap=0)
