"""``heddle bench`` with speculation: the baselines' axis, Heddle's own, and the report."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from heddle.bench._acceptance import fitted_model, load_samples, model_steps, replay_trace
from heddle.cli._main import main
from heddle.scheduler import tokens_per_step

TRACE = Path(__file__).parents[2] / "examples" / "spec-trace" / "real-math-t10.trace.jsonl.gz"


def test_bench_sweeps_stock_speculation_and_reports_it(tmp_path: Path) -> None:
    argv = ["bench", "--workload", "math", "--prompts", "2", "--gpus", "4", "--quiet"]
    argv += ["--policies", "heddle,verl", "--baseline-caps", "none"]
    argv += ["--speculation", "off,suffix:4", "--out", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads((tmp_path / "results.json").read_text())
    runs = report["runs"]
    assert "heddle suffix-kauto" in runs
    assert {k for k in runs if k.startswith("verl ")} == {
        f"verl {4 // tp}xTP{tp}{spec}" for tp in (1, 2, 4) for spec in ("", " suffix-k4")
    }
    for key, result in report["policies"].items():
        spec = result["speculation"]
        if runs[key]["speculation"] == "off":
            assert spec["method"] == "off" and spec["tokens_per_step"] == 1.0
        else:
            assert spec["method"] == "suffix"
            assert spec["num_speculative_tokens"] == runs[key]["num_speculative_tokens"]
            assert spec["tokens_per_step"] > 1.0
            assert spec["acceptance"] == "default"
    summary = report["summary"]
    plain = summary["best_tuned_baseline_without_speculation"]
    assert plain["speculation"] == "off"
    heddle = report["policies"]["heddle suffix-kauto"]["tokens_per_s"]
    assert summary["heddle_over_best_without_speculation"] == pytest.approx(
        heddle / report["policies"][plain["key"]]["tokens_per_s"]
    )
    # Stock suffix speculation on the same shape speeds verl up (memory-bound tail).
    assert (
        report["policies"]["verl 1xTP4 suffix-k4"]["tokens_per_s"]
        > report["policies"]["verl 1xTP4"]["tokens_per_s"]
    )


def test_bench_refuses_a_speculation_it_does_not_know(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--workload", "math", "--prompts", "2", "--gpus", "4", "--quiet"]
    assert main([*argv, "--speculation", "eagle:3", "--out", str(tmp_path)]) != 0
    assert "METHOD:K items with METHOD ngram or suffix" in capsys.readouterr().err
    argv += ["--speculation", "suffix:4", "--acceptance", "rosy", "--out", str(tmp_path)]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "tau:X" in err and "Traceback" not in err


@pytest.mark.slow
def test_committed_trace_replays_and_the_parametric_model_agrees_within_10_percent() -> None:
    with gzip.open(TRACE, "rt", encoding="utf-8") as f:
        assert json.loads(f.readline())["format"] == "heddle-trace"
    groups = dict(list(load_samples(TRACE).items())[:2])  # two prompts keep it quick
    kinds = (("suffix", "own"), ("suffix", "siblings"), ("suffix", "history"))
    replays = replay_trace(groups, (4,), kinds=kinds)
    own = tokens_per_step(replays[("suffix", "own", 4)])
    siblings = tokens_per_step(replays[("suffix", "siblings", 4)])
    assert 1.0 < own < siblings  # siblings' text is worth drafting from
    size = min(len(v) for v in groups.values())
    model = fitted_model(replays, 1.0, {}, "test", size)
    for (method, source, k), runs in replays.items():
        exact = sum(r.decode_steps for r in runs)
        predicted = sum(model_steps(model, method, source, k, r) for r in runs)
        assert predicted == pytest.approx(exact, rel=0.10), (method, source)
