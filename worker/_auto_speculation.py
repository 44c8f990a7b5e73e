"""``auto`` speculation: the method this machine runs, and K by batch size from the model.

A worker started with ``--speculation auto`` (and no ``--speculative-tokens-by-batch-size``
of its own) drafts with ``suffix`` where arctic-inference imports, else ``ngram``, and
takes K per engine step from :func:`heddle.scheduler.auto_k_table` (which the
simulator's Heddle runs take too). With ``suffix`` that table is where it starts: a
:class:`heddle.scheduler.MeasuredKTable` in vLLM's worker process (:func:`measured_k_table`)
rebuilds it from the acceptance the engine measures, every 2,048 request-steps, and
caps the proposer's K by it (``/v1/state.speculation.by_batch_size`` shows the table
now, ``.measured`` what it was built on). The table: for each running batch size up to the engine's
cap, the K in ``1..num_speculative_tokens`` that maximises output tokens per second
under Heddle's performance model, or 0 (off) where no K beats a plain step by 2% — a
compute-bound engine at full batch. The acceptance is
our own measurement (``ACCEPTANCE_PRESETS["pessimistic"]``: SmolLM2-135M at T=1.0,
suffix decoding with a GRPO group's siblings in the engine's tree, 1.29 tokens per
step at K=4; n-gram 1.11), so the table errs towards speculating less. The table is
logged at start-up and reported in ``/v1/state.speculation.by_batch_size``.

On vLLM's CPU build ``auto`` starts the engine without speculation
(:data:`CPU_BUILD_OFF`): measured there with SmolLM2, workers on ``auto`` ran 12-17%
behind the same runs without it. ``suffix`` or ``ngram`` still speculate when given.

Performance model: on vLLM's CPU build the engine profile measured there
(``vllm-cpu-tiny``; its TP1 figures at every TP, the only ones it holds); elsewhere the
pool's model if it names a preset (Qwen3-8B/14B/32B), else Qwen3-8B, on an H100 —
the session's own choice (heddle.rollout.perf_model_for). Context per sequence:
:data:`AUTO_CONTEXT_TOKENS`, or half the model length where that is shorter.
"""

from __future__ import annotations

from dataclasses import replace

from heddle.scheduler import (
    AUTO_ACCEPTANCE,
    AUTO_CONTEXT_TOKENS,
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    KTableSettings,
    MeasuredKTable,
    PerfModel,
    ProfiledPerfModel,
    auto_k_table,
    k_table_ranges,
    load_profile,
)

from ._speculation import BatchSizeTokens, Speculation, format_batch_size_table

__all__ = [
    "AUTO_ACCEPTANCE",
    "AUTO_CONTEXT_TOKENS",
    "CPU_BUILD_OFF",
    "auto_speculation",
    "auto_table",
    "format_speculation",
    "measured_k_table",
]


def _perf_model(model: str, tp: int, batch_cap: int, cpu_build: bool) -> tuple[PerfModel, int]:
    """The performance model and the TP it is asked at."""
    if cpu_build:
        profile = load_profile("vllm-cpu-tiny")
        at = tp if tp in profile.tps else max(profile.tps)
        return ProfiledPerfModel.from_profile(profile, batch_cap=batch_cap), at
    lowered = model.lower()
    preset = next((m for m in MODEL_PRESETS if m in lowered), "qwen3-8b")
    return PerfModel(MODEL_PRESETS[preset], HARDWARE_PRESETS["h100-sxm"], batch_cap=batch_cap), tp


def auto_table(
    method: str,
    *,
    model: str,
    tp: int,
    max_num_seqs: int,
    max_model_len: int | None,
    cpu_build: bool,
    max_k: int,
) -> tuple[BatchSizeTokens, ...]:
    """``((first, last, K), ...)`` over batch sizes 1..``max_num_seqs``; K 0: off there
    (:func:`heddle.scheduler.auto_k_table`, which the simulator takes too)."""
    perf, at = _perf_model(model, tp, max_num_seqs, cpu_build)
    rows = auto_k_table(
        perf, at, method, max_num_seqs=max_num_seqs, max_model_len=max_model_len, max_k=max_k
    )
    return k_table_ranges(rows)


def measured_k_table(
    *,
    method: str,
    model: str,
    tp: int,
    max_num_seqs: int,
    max_model_len: int | None,
    cpu_build: bool,
    max_k: int,
    rebuild_every_steps: int | None = None,
) -> MeasuredKTable:
    """The table an ``auto`` suffix engine caps K by, starting at :func:`auto_table`'s
    (built in vLLM's worker process from these settings, which the engine passes);
    ``rebuild_every_steps`` overrides :class:`KTableSettings`' (a test's short cadence)."""
    perf, at = _perf_model(model, tp, max_num_seqs, cpu_build)
    settings = KTableSettings()
    if rebuild_every_steps is not None:
        settings = replace(settings, rebuild_every_steps=rebuild_every_steps)
    return MeasuredKTable(
        perf,
        at,
        method,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_k=max_k,
        settings=settings,
    )


# Measured (docs/speculation.md, "Heddle against verl and slime"): SmolLM2 workers on
# auto ran 12-17% behind the same runs without speculation; the tiny model's profile, the
# build's only one, put K 1 where a real model's verification cost more than drafts gave.
CPU_BUILD_OFF = (
    "speculation auto: off — on vLLM's CPU build workers on auto measured 12-17% slower "
    "than workers that do not speculate (docs/speculation.md), and no profile of this "
    "build says where a real model's drafts pay; give suffix or ngram to speculate anyway"
)


def auto_speculation(
    speculation: Speculation,
    *,
    model: str,
    tp: int,
    max_num_seqs: int,
    max_model_len: int | None,
    cpu_build: bool,
) -> tuple[Speculation, str]:
    """``speculation`` as the engine runs it, and a line saying why.

    ``auto`` becomes its method here with the model's K table (off where the model
    says no batch size pays, and on vLLM's CPU build: :data:`CPU_BUILD_OFF`); any
    other method, or ``auto`` with a table given, is only resolved.
    """
    resolved = speculation.resolved()
    if speculation.method != "auto" or speculation.by_batch_size:
        return resolved, f"speculation {format_speculation(resolved)}"
    if cpu_build:
        return Speculation("off", speculation.num_speculative_tokens), CPU_BUILD_OFF
    table = auto_table(
        resolved.method,
        model=model,
        tp=tp,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        cpu_build=cpu_build,
        max_k=speculation.num_speculative_tokens,
    )
    where = "an H100 (datasheet model)"
    shown = format_batch_size_table(table)
    if max(k for _, _, k in table) == 0:
        off = Speculation("off", speculation.num_speculative_tokens)
        return off, (
            f"speculation auto: off — on {where} no K up to {speculation.num_speculative_tokens} "
            f"pays at any batch size up to {max_num_seqs} ({shown})"
        )
    measured = resolved.method == "suffix"
    # Measured: vLLM runs at the largest K the table may grow to; else vLLM's own lookup.
    chosen = (
        Speculation(resolved.method, speculation.num_speculative_tokens, table, k_measured=True)
        if measured
        else Speculation.of(resolved.method, None, table)
    )
    rebuilt = ", rebuilt from the acceptance this engine measures" if measured else ""
    return chosen, (
        f"speculation auto: {resolved.method}, K by running batch size {shown} (K 0: off), "
        f"from Heddle's performance model on {where} and the measured acceptance "
        f"({AUTO_ACCEPTANCE}){rebuilt}"
    )


def format_speculation(speculation: Speculation) -> str:
    if not speculation.on:
        return "off"
    if speculation.by_batch_size:
        table = format_batch_size_table(speculation.by_batch_size)
        if speculation.k_measured:
            return f"{speculation.method}, K by batch size from {table}, rebuilt as measured"
        return f"{speculation.method}, K by batch size {table}"
    return f"{speculation.method}, K={speculation.num_speculative_tokens}"
