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
    "fitted_model",
    "format_acceptance",
    "load_samples",
    "model_steps",
    "replay_trace",
    "run_acceptance",
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
    samples: Sequence[ReplaySample], group_size: int | None
) -> tuple[list[ReplaySample], list[ReplaySample]]:
    """The GRPO group and the task's earlier samples; without a size, the whole task is
    the group and each sample's history is the others (as an earlier iteration's)."""
    if group_size is None:
        return list(samples), []
    return list(samples[:group_size]), list(samples[group_size:])


def replay_trace(
    groups: Mapping[str, Sequence[ReplaySample]],
    ks: Sequence[int] = (2, 4, 8),
    group_size: int | None = None,
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
    group_size: int | None = None,
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


def model_steps(
    model: AcceptanceModel, method: str, source: str, k: int, run: SampleReplay
) -> float:
    """Decode steps the parametric model predicts for ``run``'s output length."""
    siblings = model.group_size - 1 if source == "siblings" else 0
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
    group_size: int,
) -> AcceptanceModel:
    """The parametric model, with the sibling curve as shares of the full group's gain
    (``group_size - 1``: the siblings, and the history samples, each replay had)."""
    group_size -= 1
    group = group_size + 1
    base = fit_acceptance(
        replays,
        name="trace",
        source_note=source_note,
        temperature=temperature,
        group_size=group,
        history_samples=group_size,
    )
    k = 4 if ("suffix", "own", 4) in replays else min(k for (_, _, k) in replays)
    own = tokens_per_step(replays[("suffix", "own", k)])
    full = tokens_per_step(replays[("suffix", "siblings", k)])
    gain = full - own
    shares = [0.0] * group
    known = {0: 0.0, group - 1: 1.0}
    if gain > 0:
        known.update(
            {n: max(0.0, min(1.0, (v - own) / gain)) for n, v in curve.items() if n < group - 1}
        )
    points = sorted(known)
    for n in range(group):
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


def run_acceptance(paths: Sequence[Path], ks: Sequence[int] = (2, 4, 8)) -> dict[str, Any]:
    """Per trace: exact tokens per step by method, source and K; the sibling curve; the
    parametric model fitted on them and its error against them (per kind and K)."""
    report: dict[str, Any] = {"traces": {}}
    for path in paths:
        groups = load_samples(path)
        replays = replay_trace(groups, ks)
        curve = sibling_curve(groups)
        temperature = _temperature(path)
        size = min(len(v) for v in groups.values())
        model = fitted_model(replays, temperature, curve, f"replayed from {path.name}", size)
        exact: dict[str, dict[str, float]] = {}
        check: dict[str, dict[str, float]] = {}
        for (method, source, k), runs in replays.items():
            label = f"{method}/{source}"
            exact.setdefault(label, {})[str(k)] = tokens_per_step(runs)
            steps = sum(r.decode_steps for r in runs)
            predicted = sum(model_steps(model, method, source, k, r) for r in runs)
            check.setdefault(label, {})[str(k)] = predicted / steps - 1.0 if steps else 0.0
        kinds: dict[str, dict[str, float]] = {}
        for kind in ("math", "code"):
            subset = {g: v for g, v in groups.items() if g.startswith(kind)}
            if subset:
                part = replay_trace(subset, (4,), kinds=(("suffix", "own"), ("suffix", "siblings")))
                kinds[kind] = {f"{m}/{s}": tokens_per_step(r) for (m, s, _), r in part.items()}
        report["traces"][path.name] = {
            "temperature": temperature,
            "groups": len(groups),
            "samples": sum(len(v) for v in groups.values()),
            "output_tokens": sum(len(s.output) for v in groups.values() for s in v),
            "tokens_per_step": exact,
            "siblings_k4": {str(n): v for n, v in curve.items()},
            "by_prompt_kind_k4": kinds,
            "parametric_relative_error": check,
            "parametric": {
                f"{m}/{s}": {str(k): list(v) for k, v in by_k.items()}
                for (m, s), by_k in model.table.items()
            },
            "position_edges": list(model.position_edges),
            "sibling_shares": list(model.sibling_curve),
        }
    return report


def _temperature(path: Path) -> float:
    """The trace's sampling temperature (record.py writes it on every line), or NaN."""
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        first = json.loads(f.readline())
    value = first.get("temperature")
    return float(value) if isinstance(value, int | float) else float("nan")


def format_acceptance(report: Mapping[str, Any]) -> str:
    lines = []
    for name, t in report["traces"].items():
        lines.append(
            f"{name}: T={t['temperature']}, {t['groups']} prompts, {t['samples']} samples, "
            f"{t['output_tokens']} output tokens; output tokens per decode step (exact replay)"
        )
        lines.append(f"  {'drafting':18s} " + " ".join(f"{'K=' + k:>7s}" for k in ("2", "4", "8")))
        for label, by_k in t["tokens_per_step"].items():
            err = t["parametric_relative_error"][label]
            cells = " ".join(f"{by_k[k]:7.3f}" for k in sorted(by_k, key=int))
            errs = ", ".join(f"{100 * err[k]:+.1f}%" for k in sorted(err, key=int))
            lines.append(f"  {label:18s} {cells}   parametric vs exact steps: {errs}")
        curve = ", ".join(f"{n}: {v:.3f}" for n, v in t["siblings_k4"].items())
        lines.append(f"  suffix with n co-located siblings (K=4): {curve}")
        for kind, values in t["by_prompt_kind_k4"].items():
            cells = ", ".join(f"{k} {v:.3f}" for k, v in values.items())
            lines.append(f"  {kind} prompts (K=4): {cells}")
    return "\n".join(lines)
