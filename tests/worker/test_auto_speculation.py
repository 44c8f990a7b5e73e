"""``--speculation auto``: K by running batch size from Heddle's performance model."""

from __future__ import annotations

import itertools

import pytest

from heddle.worker import Speculation, VLLMConfig, auto_speculation, auto_table
from heddle.worker._auto_speculation import CPU_BUILD_OFF, measured_k_table
from heddle.worker._speculation import format_batch_size_table
from heddle.worker._vllm_engine import engine_kwargs

from .._vllm import needs_suffix

ENGINE = {"model": "models/smollm2", "tp": 1, "max_num_seqs": 256, "max_model_len": 2048}


def _k_at(table: tuple[tuple[int, int, int], ...], batch: int) -> int:
    return next(k for first, last, k in table if first <= batch <= last)


def _check_table(table: tuple[tuple[int, int, int], ...], top: int) -> None:
    """Ranges 1..top in order without gaps, K never rising with the batch."""
    assert table[0][0] == 1 and table[-1][1] == top
    for (_, last, k), (first, _, k_next) in itertools.pairwise(table):
        assert first == last + 1 and k_next <= k


def test_cpu_build_speculates_at_small_batches_and_not_at_a_full_one() -> None:
    table = auto_table("suffix", cpu_build=True, max_k=4, **ENGINE)
    _check_table(table, 256)
    assert _k_at(table, 1) > 0  # memory-bound: a draft is nearly free
    assert _k_at(table, 256) == 0  # compute-bound on 2 cores: verifying costs more than it gives
    assert _k_at(table, 32) == 0  # where speculation measured slower live (docs/speculation.md)


def test_an_h100_speculates_longer_and_drafts_less_as_the_batch_grows() -> None:
    table = auto_table("suffix", cpu_build=False, max_k=8, **{**ENGINE, "model": "Qwen/Qwen3-14B"})
    _check_table(table, 256)
    assert _k_at(table, 1) >= 3 and _k_at(table, 1) > _k_at(table, 64)
    cpu = auto_table("suffix", cpu_build=True, max_k=8, **ENGINE)
    assert sum(k for _, _, k in table) > sum(k for _, _, k in cpu)
    # n-gram drafts are accepted less often: never more K than suffix at any batch size.
    ngram = auto_table("ngram", cpu_build=False, max_k=8, **{**ENGINE, "model": "Qwen/Qwen3-14B"})
    assert all(_k_at(ngram, b) <= _k_at(table, b) for b in (1, 8, 64, 256))


QWEN = {**ENGINE, "model": "Qwen/Qwen3-14B"}


@needs_suffix
def test_auto_becomes_suffix_with_the_table_in_vllms_config() -> None:
    config = VLLMConfig(
        model="Qwen/Qwen3-14B",
        max_model_len=2048,
        max_num_seqs=256,
        speculation=Speculation("auto"),
    )
    spec, why = auto_speculation(config.speculation, cpu_build=False, **QWEN)
    assert spec.method == "suffix" and spec.by_batch_size == auto_table(
        "suffix", cpu_build=False, max_k=4, **QWEN
    )
    assert f"K by running batch size {format_batch_size_table(spec.by_batch_size)}" in why
    assert _k_at(spec.by_batch_size, 1) > 0 and _k_at(spec.by_batch_size, 256) == 0
    # Suffix: the table is where K starts; vLLM runs at the largest K the table may grow
    # to, and Heddle's proposer patch caps each step by the table it rebuilds as it measures.
    assert spec.k_measured and "rebuilt from the acceptance this engine measures" in why
    vllm = engine_kwargs(config, cpu_build=False)["speculative_config"]
    assert vllm["method"] == "suffix"
    assert vllm["num_speculative_tokens"] == 4
    assert "num_speculative_tokens_per_batch_size" not in vllm


def test_auto_on_the_cpu_build_starts_without_speculation_and_says_why() -> None:
    # Measured: SmolLM2 workers on auto ran 12-17% behind the same runs without it.
    spec, why = auto_speculation(Speculation("auto"), cpu_build=True, **ENGINE)
    assert not spec.on and why == CPU_BUILD_OFF
    assert "give suffix or ngram" in why
    config = VLLMConfig(model="models/smollm2", max_num_seqs=256, speculation=Speculation("auto"))
    assert "speculative_config" not in engine_kwargs(config, cpu_build=True)
    # A method given is run as given on that build.
    given = VLLMConfig(model="models/smollm2", speculation=Speculation("suffix", 2))
    assert engine_kwargs(given, cpu_build=True)["speculative_config"]["method"] == "suffix"


def test_auto_on_ngram_keeps_vllms_own_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    # No suffix proposer to cap: n-gram drafts by vLLM's batch-size table, fixed at start.
    monkeypatch.setattr("heddle.worker._speculation.suffix_available", lambda: False)
    engine = {**ENGINE, "model": "Qwen/Qwen3-14B"}
    spec, why = auto_speculation(Speculation("auto"), cpu_build=False, **engine)
    assert spec.method == "ngram" and not spec.k_measured and "rebuilt" not in why
    config = VLLMConfig(model="Qwen/Qwen3-14B", max_num_seqs=256, speculation=Speculation("auto"))
    vllm = engine_kwargs(config, cpu_build=False)["speculative_config"]
    assert vllm["num_speculative_tokens_per_batch_size"] == [list(e) for e in spec.by_batch_size]


def test_the_measured_table_starts_where_the_auto_table_is() -> None:
    # Built in vLLM's worker process from the settings the engine passes.
    table = measured_k_table(method="suffix", max_k=4, cpu_build=True, **ENGINE)
    start = auto_table("suffix", cpu_build=True, max_k=4, **ENGINE)
    assert [[a, b, k] for a, b, k in start] == table.state()["by_batch_size"]
    assert table.settings.rebuild_every_steps == 2048
    quick = measured_k_table(
        method="suffix", max_k=4, cpu_build=True, rebuild_every_steps=8, **ENGINE
    )
    assert quick.settings.rebuild_every_steps == 8


def test_auto_where_no_k_pays_is_off_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # A model under which no K beats a plain step at any batch size.
    monkeypatch.setattr(
        "heddle.worker._auto_speculation.auto_k_table",
        lambda *_, max_num_seqs, **__: [(max_num_seqs, 0)],
    )
    spec, why = auto_speculation(Speculation("auto"), cpu_build=False, **QWEN)
    assert not spec.on
    assert why.startswith("speculation auto: off") and "1-256:0" in why and "H100" in why


def test_a_given_method_or_table_is_kept() -> None:
    pinned = Speculation.of("auto", None, ((1, 4, 2), (5, 256, 0)))
    spec, _ = auto_speculation(pinned, cpu_build=True, **ENGINE)
    assert spec.by_batch_size == pinned.by_batch_size
    fixed = Speculation("ngram", 3)
    assert auto_speculation(fixed, cpu_build=True, **ENGINE) == (fixed, "speculation ngram, K=3")
