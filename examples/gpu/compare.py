"""Compare a ``verify_cost.py`` result with the simulator's performance model.

For every measured (batch, k, context) row it prints what ``heddle.scheduler``'s
``PerfModel`` predicts for the same step on the named hardware preset, with
the preset's per-step overhead left out (the script times the forward pass
alone): the verification ratio ``t(k)/t(0)`` (what decides whether drafts
pay) and the plain step's forward time (what decides the simulated clock).

Usage: python examples/gpu/compare.py results/verify-qwen3-8b-h100.json
       [--hardware h100-sxm] [--model qwen3-8b] [--rows]
The model preset defaults to the result's own shape name.

With ``--k-regret`` it also judges the K that ``choose_k`` takes on the model
(1, 2, 4 or 8 drafts, or off) by the measured step times plus the preset's
step overhead, at the default and pessimistic acceptance, own text and a full
GRPO group of siblings: tokens per second of the chosen K over the best K in
hindsight, and over speculation off.
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


def forward_s(perf: PerfModel, batch: int, context: int, k: int) -> float:
    """The modelled step at TP1 without the preset's fixed per-step overhead."""
    return float(perf.iteration_time(batch, float(batch * context), 1, draft_tokens=k))


def compare(result: dict[str, Any], hardware: str, model: str) -> dict[str, Any]:
    hw = replace(HARDWARE_PRESETS[hardware], step_overhead_ms=0.0)
    perf = PerfModel(MODEL_PRESETS[model], hw)
    rows = [r for r in result["rows"] if "ms_median" in r]
    base = {(r["batch"], r["context"]): r["ms_median"] for r in rows if r["k"] == 0}
    ratios, plains = [], []
    for r in rows:
        key = (r["batch"], r["context"])
        if key not in base:
            continue
        if r["k"] == 0:
            modelled_ms = forward_s(perf, r["batch"], r["context"], 0) * 1e3
            plains.append(
                {
                    **r,
                    "model_ms": round(modelled_ms, 3),
                    "model_over_measured": round(modelled_ms / r["ms_median"], 3),
                }
            )
            continue
        measured = r["ms_median"] / base[key]
        modelled = forward_s(perf, r["batch"], r["context"], r["k"]) / forward_s(
            perf, r["batch"], r["context"], 0
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
    overhead_s = perf.hardware.step_overhead_ms * 1e-3
    step_s = {
        (r["batch"], r["k"], r["context"]): r["ms_median"] * 1e-3 + overhead_s
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

                chosen = choose_k(perf, 1, b, float(b * c), tps, ks=ks)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path)
    parser.add_argument("--hardware", default="h100-sxm", choices=sorted(HARDWARE_PRESETS))
    parser.add_argument("--model", choices=sorted(MODEL_PRESETS))
    parser.add_argument("--rows", action="store_true", help="print every row too")
    parser.add_argument("--k-regret", action="store_true", help="judge choose_k on measured times")
    args = parser.parse_args(argv)
    try:
        result = json.loads(args.result.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(
            f"cannot read {args.result}: {exc}; pass a verify_cost.py result file", file=sys.stderr
        )
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
