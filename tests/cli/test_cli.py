"""The ``heddle`` command: version, component benchmarks, and errors that say what to fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from heddle import __version__
from heddle.cli._main import error_line, main
from heddle.exceptions import AddressInUseError, HttpTimeoutError


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "heddle", *args], capture_output=True, text=True, check=False
    )


@pytest.mark.slow
def test_version_is_the_installed_distributions() -> None:
    result = run("version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"heddle {__version__}"
    assert __version__ != "0+unknown"


@pytest.mark.slow
def test_bench_placement_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bench",
            "placement",
            "--trajectories",
            "300",
            "--instances",
            "8",
            "--tp-mix",
            "1,2",
            "--repeats",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    result = json.loads((tmp_path / "placement.json").read_text())
    assert result["trajectories"] == 300 and result["instances"] == 8
    assert result["tps"] == [1, 2]
    exact = result["exact_dp"]["predicted_makespan_s"]
    assert result["split"]["predicted_makespan_s"] == pytest.approx(exact, rel=1e-9)
    assert "median" in capsys.readouterr().out


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_bench_rollout_compares_heddle_with_the_best_tuned_baseline(tmp_path: Path) -> None:
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
            "--baseline-caps",
            "none,8",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "results.json").read_text())
    # Every baseline at every homogeneous TP the 4 GPUs allow, with and without the cap.
    expected = {"heddle"} | {
        f"{p} {4 // tp}xTP{tp}{cap}" for p in ("verl", "slime") for tp in (1, 2, 4)
        for cap in ("", " cap8")
    }  # fmt: skip
    assert set(report["policies"]) == expected
    assert report["trajectories"] == 6 * 16
    summary = report["summary"]
    best = summary["best_tuned_baseline"]
    throughput = {k: r["tokens_per_s"] for k, r in report["policies"].items() if k != "heddle"}
    assert throughput[best["key"]] == max(throughput.values())
    assert (
        summary["paper_config_baseline"]["tp"] == 1
        and summary["paper_config_baseline"]["cap"] is None
    )
    heddle = report["policies"]["heddle"]["tokens_per_s"]
    assert summary["heddle_over_best_tuned_baseline"] == pytest.approx(
        heddle / throughput[best["key"]]
    )
    bound = report["lower_bound"]["makespan_s"]
    for result in report["policies"].values():
        assert result["makespan_s"] >= bound
        assert result["tokens"] == report["policies"]["heddle"]["tokens"]
    assert (tmp_path / "rollout.png").stat().st_size > 10_000


def test_bench_ablation_adds_each_mechanism_as_its_own_row(tmp_path: Path) -> None:
    argv = ["bench", "--workload", "math", "--prompts", "4", "--gpus", "4", "--quiet"]
    argv += ["--policies", "verl", "--baseline-caps", "none", "--ablation", "--out", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads((tmp_path / "results.json").read_text())
    rows = {k for k in report["policies"] if not k.startswith("verl ")}
    # Progressive priority, + placement, + migration, + the shape planner, + tail merges.
    assert rows == {"heddle-order", "heddle-place", "heddle-migrate", "heddle", "heddle-dynamic"}
    tokens = {r["tokens"] for r in report["policies"].values()}
    assert len(tokens) == 1  # every row ran the same trajectories


def test_bench_rollout_replays_a_trace_of_heddle_records(tmp_path: Path) -> None:
    """A trace in Heddle's own output format: only finished records are replayed."""
    rows = [
        {"task_id": f"p{g}", "sample": s, "status": "done", "tokens": {"prompt": 300},
         "trace": {"turn_tokens": [200 * (g + 1), 50], "tool_latency_s": [0.4],
                   "tool_output_tokens": [30]}}
        for g in range(3) for s in range(4)
    ] + [{"task_id": "p9", "sample": 0, "status": "truncated", "tokens": {"prompt": 1},
          "trace": {"turn_tokens": [1]}}]  # fmt: skip
    trace = tmp_path / "rollout.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    code = main(
        [
            "bench",
            "--workload",
            str(trace),
            "--gpus",
            "2",
            "--quiet",
            "--policies",
            "heddle,verl",
            "--baseline-caps",
            "none",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["workload"] == "rollout" and report["trajectories"] == 12
    assert report["policies"]["heddle"]["tokens"] == sum(200 * (g + 1) + 50 for g in range(3)) * 4


def test_a_malformed_trace_is_one_sentence_naming_the_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"group": "g", "prompt_tokens": 5, "turn_tokens": [3]}\n'
        '{"group": "g", "prompt_tokens": 5, "turn_tokens": [3, 4], "secret": "hunter2"}\n'
    )
    result = run("bench", "--workload", str(trace), "--out", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"heddle: error: {trace} line 2: 2 turns need 1 tool calls between them, but "
        "'tool_latency_s' has 0 and 'tool_output_tokens' 0"
    )


def test_bench_rollout_refuses_an_unknown_policy(tmp_path: Path) -> None:
    result = run("bench", "--policies", "heddle,verl3", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "unknown scheduling policy 'verl3'; choose one of" in result.stderr


@pytest.mark.slow
def test_bad_tool_allow_list_stops_the_operator_with_a_sentence() -> None:
    result = run("operator", "--tool-allowed-hosts", "sandbox.rl.svc,http://10.0.0.1/x")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "heddle: error: --tool-allowed-hosts entry 'http://10.0.0.1/x' is neither a host name "
        "nor an IP network; give names (sandbox.rl.svc, *.tools.svc), CIDRs (10.0.0.0/8) or * "
        "for any host, "
        "comma-separated"
    )


@pytest.mark.slow  # worker and agent processes
def test_bench_gateway_measures_overhead_and_calls_per_second(tmp_path: Path) -> None:
    result = run("bench", "gateway", "--calls", "20", "--concurrency", "4", "--repeats", "1",
                 "--out", str(tmp_path))  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "gateway.json").read_text())
    assert data["median_direct_step_ms"] > 0 and data["median_gateway_call_ms"] > 0
    assert data["median_calls_per_s"] > 1 and data["concurrency"] == 4
    assert "overhead" in result.stdout and "calls/s" in result.stdout


@pytest.mark.slow
def test_an_unknown_pod_policy_exemption_stops_the_operator_with_a_sentence() -> None:
    result = run("operator", "--pod-allow", "hostPath,everything")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "heddle: error: pod policy exemption(s) ['everything'] unknown; choose from "
        "['hostNetwork', 'hostPath', 'secretVolumes', 'serviceAccountToken', 'otherVolumes', "
        "'capabilities']"
    )


def test_bench_iterations_writes_trained_samples_and_length_bias(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--iterations", "2", "--max-staleness", "1", "--workload", "math"]
    argv += ["--prompts", "4", "--gpus", "8", "--policies", "verl,areal,heddle"]
    argv += ["--baseline-caps", "none", "--quiet", "--out", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads((tmp_path / "results.json").read_text())
    assert set(report["policies"]) == {"verl", "areal", "heddle"}
    # areal at every split the pool allows (TP4 engines: 4 of 8 GPUs), heddle at every
    # over-sampling factor; each policy's figure is its best configuration's.
    assert set(report["runs"]) == {"verl", "areal rollout4", *(
        f"heddle over{o}" for o in ("0.25", "0.5", "1")
    )}  # fmt: skip
    for name, best in report["policies"].items():
        mine = [r for k, r in report["runs"].items() if k.split()[0] == name]
        assert best["trained_samples_per_s"] == max(r["trained_samples_per_s"] for r in mine)
        assert best["trained_samples"] == 2 * 4 * 16
        assert best["trained_p90_tokens"] >= best["trained_mean_tokens"] > 0
    assert report["policies"]["verl"]["staleness_max"] == 0
    assert report["policies"]["heddle"]["staleness_max"] <= 1
    summary = report["summary"]
    assert summary["length_bias"]["verl"] == {"mean": 0.0, "p90": 0.0}
    ratio = summary["heddle_over_best_sync"]
    heddle, verl = report["policies"]["heddle"], report["policies"]["verl"]
    assert ratio == pytest.approx(heddle["trained_samples_per_s"] / verl["trained_samples_per_s"])
    assert "heddle / best synchronous (verl)" in capsys.readouterr().out


def test_bench_iterations_refuses_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--iterations", "2", "--policies", "verl,fast"]) == 2
    assert "unknown policy 'fast' for --iterations" in capsys.readouterr().err


def test_a_worker_that_stops_answering_mid_command_is_one_sentence_not_a_traceback() -> None:
    # `heddle bench profile` once ended in a traceback when a worker's reply never came.
    line, code = error_line(
        HttpTimeoutError("POST /v1/trajectories/p-1/generate: no answer within 600 s")
    )
    assert code == 1
    assert line.startswith(
        "heddle: error: POST /v1/trajectories/p-1/generate: no answer within 600 s"
    )
    assert "\n" not in line and "its log says why" in line
    assert error_line(AddressInUseError("port 8000 is taken")) == (
        "heddle: error: port 8000 is taken",
        AddressInUseError.exit_code,
    )
    assert error_line(FileNotFoundError(2, "No such file or directory", "x.yaml")) == (
        "heddle: error: No such file or directory (x.yaml)",
        2,
    )
    assert error_line(KeyboardInterrupt()) == ("heddle: interrupted", 130)
