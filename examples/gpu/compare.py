"""Compare a ``verify_cost.py`` result with the simulator's performance model.

For every measured (batch, k, context) row it prints what ``heddle.scheduler``'s
``PerfModel`` predicts for the same step on the named hardware preset, at the
result's tensor-parallel degree (``tp``, 1 when absent), with the preset's
per-step overhead and the all-reduces left out (the script times one GPU's
forward pass alone): the verification ratio ``t(k)/t(0)`` (what decides
whether drafts pay) and the plain step's forward time (what decides the
simulated clock).

Usage: python examples/gpu/compare.py results/verify-qwen3-8b-h100.json
       [--faster-of OTHER.json] [--hardware h100-sxm] [--model qwen3-8b] [--rows]
The model preset defaults to the result's own shape name. ``--faster-of``
takes, row by row, the faster of two results of the same model, TP and GPU
measured with different attention kernels (``--attention sdpa`` and
``split``): what an engine that picks its decode kernel by shape would run.

With ``--k-regret`` it also judges the K that ``choose_k`` takes on the model
(1, 2, 4 or 8 drafts, or off) by the measured step times plus the preset's
step overhead and modelled all-reduces, at the default and pessimistic
acceptance, own text and a full GRPO group of siblings: tokens per second
of the chosen K over the best K in hindsight, and over speculation off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from heddle.scheduler import HARDWARE_PRESETS, MODEL_PRESETS, PerfModel, acceptance_model, choose_k


def forward_perf(hardware: str, model: str) -> PerfModel:
    """The preset with nothing outside one GPU's forward pass: no per-step overhead and
    free all-reduces (what ``verify_cost.py`` times)."""
    hw = replace(
        HARDWARE_PRESETS[hardware],
        step_overhead_ms=0.0,
        all_reduce_latency_us=0.0,
        interconnect_gbps=float("inf"),
    )
    return PerfModel(MODEL_PRESETS[model], hw)


def forward_s(perf: PerfModel, batch: int, context: int, k: int, tp: int = 1) -> float:
    """The modelled step of ``forward_perf``'s preset at ``tp``."""
    return float(perf.iteration_time(batch, float(batch * context), tp, draft_tokens=k))


def result_tp(result: dict[str, Any]) -> int:
    return int(result.get("tp", 1))


def faster_of(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Row by row, the faster of two results of one model, TP and GPU; each row says
    which attention it came from. Rows only one result has are left out."""
    if result_tp(a) != result_tp(b):
        raise ValueError(f"the two results differ in tp: {result_tp(a)} and {result_tp(b)}")
    for key in ("device", "model"):
        if a.get(key) != b.get(key):
            raise ValueError(f"the two results differ in {key}: {a.get(key)} and {b.get(key)}")

    def rows(r: dict[str, Any]) -> dict[tuple[int, int, int], dict[str, Any]]:
        kernel = r.get("attention", "sdpa")
        return {
            (x["batch"], x["k"], x["context"]): {**x, "attention": kernel}
            for x in r["rows"]
            if "ms_median" in x
        }

    ra, rb = rows(a), rows(b)
    merged = [
        min(ra[key], rb[key], key=lambda x: float(x["ms_median"]))
        for key in sorted(set(ra) & set(rb))
    ]
    return {**a, "attention": "faster of the two per row", "rows": merged}


def compare(result: dict[str, Any], hardware: str, model: str) -> dict[str, Any]:
    perf = forward_perf(hardware, model)
    tp = result_tp(result)
    rows = [r for r in result["rows"] if "ms_median" in r]
    base = {(r["batch"], r["context"]): r["ms_median"] for r in rows if r["k"] == 0}
    ratios, plains = [], []
    for r in rows:
        key = (r["batch"], r["context"])
        if key not in base:
            continue
        if r["k"] == 0:
            modelled_ms = forward_s(perf, r["batch"], r["context"], 0, tp) * 1e3
            plains.append(
                {
                    **r,
                    "model_ms": round(modelled_ms, 3),
                    "model_over_measured": round(modelled_ms / r["ms_median"], 3),
                }
            )
            continue
        measured = r["ms_median"] / base[key]
        modelled = forward_s(perf, r["batch"], r["context"], r["k"], tp) / forward_s(
            perf, r["batch"], r["context"], 0, tp
        )
        ratios.append(
            {
                **r,
                "measured_ratio": round(measured, 3),
                "model_ratio": round(modelled, 3),
                "error": round(modelled / measured - 1, 4),
            }
        )
    errors = [x["error"] for x in ratios]
    over = [x["model_over_measured"] for x in plains]
    worst = max(ratios, key=lambda x: abs(x["error"]), default=None)
    return {
        "device": result.get("device"),
        "model": model,
        "hardware": hardware,
        "tp": tp,
        "ratio_rows": len(ratios),
        "ratio_mean_abs_error": round(statistics.fmean(abs(e) for e in errors), 4)
        if errors
        else None,
        "ratio_mean_error": round(statistics.fmean(errors), 4) if errors else None,
        "ratio_worst": worst,
        "plain_rows": len(plains),
        "plain_model_over_measured_median": round(statistics.median(over), 3) if over else None,
        "plain_model_over_measured_range": [min(over), max(over)] if over else None,
        "ratios": ratios,
        "plains": plains,
    }


def k_regret(result: dict[str, Any], hardware: str, model: str) -> list[dict[str, Any]]:
    """Per acceptance and corpus: the worst of the model's K choices on measured times."""
    perf = PerfModel(MODEL_PRESETS[model], HARDWARE_PRESETS[hardware])
    tp = result_tp(result)
    bare = forward_perf(hardware, model)

    def outside_s(b: int, c: int, k: int) -> float:
        """What the whole modelled step adds to one GPU's forward: overhead, all-reduces."""
        return float(
            perf.iteration_time(b, float(b * c), tp, draft_tokens=k)
            - bare.iteration_time(b, float(b * c), tp, draft_tokens=k)
        )

    step_s = {
        (r["batch"], r["k"], r["context"]): r["ms_median"] * 1e-3
        + outside_s(r["batch"], r["context"], r["k"])
        for r in result["rows"]
        if "ms_median" in r
    }
    ks = (1, 2, 4, 8)
    points = sorted({(b, c) for (b, k, c) in step_s if all((b, x, c) in step_s for x in (0, *ks))})
    out = []
    for name in ("default", "pessimistic"):
        acc = acceptance_model(name)
        for siblings in (0, acc.group_size - 1):

            def tps(k: int, s: int = siblings, a: Any = acc) -> float:
                return float(a.tokens_per_step("suffix", k, siblings=s))

            worst_best: tuple[float, dict[str, int] | None] = (2.0, None)
            worst_off: tuple[float, dict[str, int] | None] = (2.0, None)
            for b, c in points:

                def rate(k: int, b: int = b, c: int = c) -> float:
                    return tps(k) / float(step_s[(b, k, c)])

                chosen = choose_k(perf, tp, b, float(b * c), tps, ks=ks)
                best = max((0, *ks), key=rate)
                where = {"batch": b, "context": c, "chosen_k": chosen, "best_k": best}
                worst_best = min(worst_best, (rate(chosen) / rate(best), where), key=lambda x: x[0])
                worst_off = min(worst_off, (rate(chosen) / rate(0), where), key=lambda x: x[0])
            out.append(
                {
                    "acceptance": name,
                    "siblings": siblings,
                    "points": len(points),
                    "chosen_over_best_min": round(worst_best[0], 3),
                    "at": worst_best[1],
                    "chosen_over_off_min": round(worst_off[0], 3),
                    "off_at": worst_off[1],
                }
            )
    return out


def _load(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path)
    parser.add_argument("--faster-of", type=Path, help="a second result: the faster row of each")
    parser.add_argument("--hardware", default="h100-sxm", choices=sorted(HARDWARE_PRESETS))
    parser.add_argument("--model", choices=sorted(MODEL_PRESETS))
    parser.add_argument("--rows", action="store_true", help="print every row too")
    parser.add_argument("--k-regret", action="store_true", help="judge choose_k on measured times")
    args = parser.parse_args(argv)
    try:
        result = _load(args.result)
        if args.faster_of is not None:
            result = faster_of(result, _load(args.faster_of))
    except ValueError as exc:
        print(f"{exc}; pass verify_cost.py result files", file=sys.stderr)
        return 2
    model = args.model or result.get("model", {}).get("name", "")
    if model not in MODEL_PRESETS:
        print(
            f"no model preset {model!r}; pass --model, one of {sorted(MODEL_PRESETS)}",
            file=sys.stderr,
        )
        return 2
    out = compare(result, args.hardware, model)
    if args.rows:
        for row in out["plains"] + out["ratios"]:
            print(json.dumps(row))
    summary = {k: v for k, v in out.items() if k not in ("ratios", "plains")}
    if args.k_regret:
        summary["k_regret"] = k_regret(result, args.hardware, model)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
