"""``heddle bench acceptance``: tokens per decode step replayed exactly from token traces.

Reads a token trace (``heddle run --trace``, or examples/spec-trace/record.py;
``.gz`` allowed), takes samples ``0..group-1`` of each task as the GRPO group
and the rest as the task's earlier samples ("history"), replays every sample
against vLLM's drafters (:mod:`heddle.scheduler._replay`) for each method,
source and K, fits the parametric acceptance model on the replays and checks it
against them (docs/speculation.md).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from heddle.exceptions import WorkloadError
from heddle.scheduler import (
    AcceptanceModel,
    ReplayConfig,
    ReplaySample,
    SampleReplay,
    fit_acceptance,
    replay_group,
    tokens_per_step,
)

__all__ = [
    "REPLAY_KINDS",
    "load_samples",
    "model_steps",
    "replay_trace",
    "sibling_curve",
]

# (method, source) pairs a trace is replayed under.
REPLAY_KINDS: tuple[tuple[str, str], ...] = (
    ("ngram", "own"),
    ("suffix", "own"),
    ("suffix", "siblings"),
    ("suffix", "history"),
)


def load_samples(path: Path) -> dict[str, list[ReplaySample]]:
    """Task -> its samples (single-turn: the first step's prompt and output ids)."""
    opener: Any = gzip.open if path.suffix == ".gz" else open
    groups: dict[str, list[ReplaySample]] = defaultdict(list)
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    step = row["steps"][0]
                    sample = ReplaySample(
                        str(row["group"]),
                        int(row["sample"]),
                        tuple(int(t) for t in step["input_token_ids"]),
                        tuple(int(t) for t in step["output_token_ids"]),
                    )
                except (ValueError, KeyError, IndexError, TypeError):
                    raise WorkloadError(
                        f"{path} line {number}: not a token-trace line with group, sample and "
                        "steps[0].input_token_ids/output_token_ids (docs/workloads.md)"
                    ) from None
                groups[sample.group].append(sample)
    except OSError as exc:
        raise WorkloadError(f"trace {path}: cannot be read ({exc.strerror})") from None
    if not groups:
        raise WorkloadError(f"trace {path}: no samples")
    return {g: sorted(v, key=lambda s: s.sample) for g, v in groups.items()}


def _split(
    samples: Sequence[ReplaySample], group_size: int
) -> tuple[list[ReplaySample], list[ReplaySample]]:
    return list(samples[:group_size]), list(samples[group_size:])


def replay_trace(
    groups: Mapping[str, Sequence[ReplaySample]],
    ks: Sequence[int] = (2, 4, 8),
    group_size: int = 16,
    kinds: Sequence[tuple[str, str]] = REPLAY_KINDS,
    siblings: int | None = None,
) -> dict[tuple[str, str, int], list[SampleReplay]]:
    """Every group sample replayed per (method, source, K)."""
    out: dict[tuple[str, str, int], list[SampleReplay]] = {}
    for method, source in kinds:
        for k in ks:
            config = ReplayConfig(method, k, source, siblings=siblings)  # type: ignore[arg-type]
            runs: list[SampleReplay] = []
            for samples in groups.values():
                group, history = _split(samples, group_size)
                runs += replay_group(group, config, history)
            out[(method, source, k)] = runs
    return out


def sibling_curve(
    groups: Mapping[str, Sequence[ReplaySample]],
    k: int = 4,
    group_size: int = 16,
    counts: Sequence[int] = (1, 3, 7),
) -> dict[int, float]:
    """Tokens per step with ``n`` co-located siblings (suffix), ``n`` in ``counts``."""
    out: dict[int, float] = {}
    for n in counts:
        config = ReplayConfig("suffix", k, "siblings", siblings=n)
        runs: list[SampleReplay] = []
        for samples in groups.values():
            runs += replay_group(_split(samples, group_size)[0], config)
        out[n] = tokens_per_step(runs)
    return out


def model_steps(model: AcceptanceModel, method: str, source: str, k: int, run: SampleReplay) -> float:
    """Decode steps the parametric model predicts for ``run``'s output length."""
    siblings = model.group_size - 1 if source in ("siblings", "history") else 0
    history = model.history_samples if source == "history" else 0
    pos, steps = 1.0, 0.0
    while pos < run.output_tokens:
        tau = model.tokens_per_step(method, k, siblings=siblings, history=history, position=pos)
        # A step cannot emit past the end: the last one is counted whole.
        pos += tau
        steps += 1.0
    return steps


def fitted_model(
    replays: Mapping[tuple[str, str, int], Sequence[SampleReplay]],
    temperature: float,
    curve: Mapping[int, float],
    source_note: str,
) -> AcceptanceModel:
    """The parametric model, with the sibling curve as shares of the full group's gain."""
    base = fit_acceptance(replays, name="trace", source_note=source_note, temperature=temperature)
    k = 4 if ("suffix", "own", 4) in replays else min(k for (_, _, k) in replays)
    own = tokens_per_step(replays[("suffix", "own", k)])
    full = tokens_per_step(replays[("suffix", "siblings", k)])
    gain = full - own
    shares = [0.0] * 16
    known = {0: 0.0, 15: 1.0}
    if gain > 0:
        known.update({n: max(0.0, min(1.0, (v - own) / gain)) for n, v in curve.items()})
    points = sorted(known)
    for n in range(16):
        lo = max(p for p in points if p <= n)
        hi = min(p for p in points if p >= n)
        w = 0.0 if hi == lo else (n - lo) / (hi - lo)
        shares[n] = known[lo] * (1 - w) + known[hi] * w
    return AcceptanceModel(
        base.name,
        base.source_note,
        base.temperature,
        base.position_edges,
        base.table,
        base.group_size,
        base.history_samples,
        tuple(shares),
    )
