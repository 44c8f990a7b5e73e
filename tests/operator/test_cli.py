"""The ``heddle`` command: version, component benchmarks, and errors that say what to fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from heddle import __version__
from heddle.operator._cli import main


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "heddle", *args], capture_output=True, text=True, check=False
    )


def test_version_is_the_installed_distributions() -> None:
    result = run("version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"heddle {__version__}"
    assert __version__ != "0+unknown"


def test_bench_placement_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bench",
            "placement",
            "--trajectories",
            "300",
            "--instances",
            "8",
            "--repeats",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    result = json.loads((tmp_path / "placement.json").read_text())
    assert result["trajectories"] == 300 and result["instances"] == 8
    exact = result["exact"]["predicted_makespan_s"]
    assert exact <= result["aggregated_1024"]["predicted_makespan_s"] * (1 + 1e-9)
    assert "median" in capsys.readouterr().out


def test_bench_shape_writes_json(tmp_path: Path) -> None:
    code = main(
        [
            "bench",
            "shape",
            "--gpus",
            "16",
            "--trajectories",
            "400",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    result = json.loads((tmp_path / "shape.json").read_text())
    assert result["gpus"] == 16
    assert result["predicted_makespan_s"] <= result["baseline_makespan_s"]


def test_bad_workload_is_a_clear_error_with_exit_code_2(tmp_path: Path) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text("name: w\nprompts: -1\n")
    result = run("bench", "placement", "--workload", str(bad), "--out", str(tmp_path))
    assert result.returncode == 2
    assert "heddle: error:" in result.stderr and "missing field" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_bench_target_is_refused_by_the_parser() -> None:
    result = run("bench", "everything")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_bench_rollout_compares_policies_and_writes_results(tmp_path: Path) -> None:
    code = main(
        [
            "bench",
            "--workload",
            "math",
            "--prompts",
            "6",
            "--gpus",
            "4",
            "--quiet",
            "--policies",
            "heddle,verl,slime",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "results.json").read_text())
    assert set(report["policies"]) == {"heddle", "verl", "slime"}
    assert report["trajectories"] == 6 * 16
    assert report["summary"]["best_baseline"] in {"verl", "slime"}
    bound = report["lower_bound"]["makespan_s"]
    for result in report["policies"].values():
        assert result["makespan_s"] >= bound
        assert result["tokens"] == report["policies"]["verl"]["tokens"]
    assert (tmp_path / "rollout.png").stat().st_size > 10_000


def test_bench_rollout_refuses_an_unknown_policy(tmp_path: Path) -> None:
    result = run("bench", "--policies", "heddle,verl3", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "unknown scheduling policy 'verl3'; choose one of" in result.stderr


def test_bad_tool_allow_list_stops_the_operator_with_a_sentence() -> None:
    result = run("operator", "--tool-allowed-hosts", "sandbox.rl.svc,http://10.0.0.1/x")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "heddle: error: --tool-allowed-hosts entry 'http://10.0.0.1/x' is neither a host name "
        "nor an IP network; give names (sandbox.rl.svc, *.tools.svc) or CIDRs (10.0.0.0/8), "
        "comma-separated"
    )
