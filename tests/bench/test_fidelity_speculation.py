"""``heddle bench fidelity --speculation``'s pieces without vLLM: the drafter replayed over
a run's tokens on the engines they ran on, the workers' K reaching the simulator, and
bad input refused in one sentence. (The sim engine does not draft, so the end-to-end
path needs real workers: docs/benchmarks.md, Fidelity.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from heddle.bench import (
    fidelity_cluster,
    fidelity_speculation,
    format_fidelity,
    k_for_batch,
    parse_fidelity_speculation,
    replay_engines,
    requests_of,
)
from heddle.cli import main
from heddle.exceptions import ConfigError
from heddle.rollout import load_workload
from heddle.scheduler import (
    ReplayConfig,
    ReplaySample,
    generate,
    get_policy,
    load_profile,
    replay_group,
)
from heddle.scheduler.sim import SimConfig, Simulator
from heddle.worker import Speculation

TEXT = list(range(100, 120))  # 20 tokens that never repeat within themselves


def _line(tid: str, worker: str, prompt: list[int], output: list[int], at: float) -> dict[str, Any]:
    step = {"input_token_ids": prompt, "output_token_ids": output, "worker": worker,
            "started_at": at, "queue_s": 0.0, "engine_s": 1.0, "total_s": 1.0}  # fmt: skip
    return {"trajectory_id": tid, "task_index": 0, "sample": 0, "steps": [step]}


def test_an_engine_drafts_from_what_it_served_before_and_only_that_engine() -> None:
    # An earlier run wrote TEXT on engine a; the next run writes it again on a and on b.
    reqs = requests_of("warmup", [_line("w", "a", [1, 2], TEXT, 0.0)])
    reqs += requests_of(
        "run", [_line("x", "a", [1, 2], TEXT, 10.0), _line("y", "b", [1, 2], TEXT, 10.0)]
    )
    got = replay_engines(reqs, "suffix", k_for_batch(4))["run"]
    # On a: the first token from the prefill, then drafts from the earlier response, at
    # most as long as the match (vLLM's max_spec_factor 1.0) and K = 4: steps of 2, 4, 5,
    # 5 and the last 3 tokens: 14 accepted, 20 tokens over 6 engine steps.
    assert (got["x"].tokens, got["x"].accepted) == (20, 14)
    assert got["x"].tokens_per_step == pytest.approx(20 / 6)
    # On b nothing held TEXT and TEXT never repeats: no draft accepted.
    assert (got["y"].tokens, got["y"].accepted) == (20, 0)
    assert got["y"].tokens_per_step == 1.0
    # K from the workers' table by the engine's running requests: off at batch 1.
    off = replay_engines(reqs, "suffix", k_for_batch(4, ((1, 1, 0), (2, 64, 4))))["run"]
    assert off["x"].accepted == 0


def test_a_running_sibling_helps_only_with_text_it_had_written() -> None:
    # Two requests write TEXT side by side on one engine; the second starts when the first
    # is half done, so it can draft the first half from it but not the second.
    reqs = requests_of("run", [_line("x", "a", [1], TEXT, 0.0), _line("y", "a", [1], TEXT, 0.5)])
    got = replay_engines(reqs, "suffix", k_for_batch(4))["run"]
    assert got["x"].accepted == 0  # nothing before it
    assert 0 < got["y"].accepted < 15  # helped, but not as much as by a finished text


def test_a_request_alone_replays_as_the_exact_replay_does() -> None:
    # A text with repeats, alone on its engine: the same accepted drafts as replay_group's
    # own-text replay (scheduler/_replay.py, checked against vLLM's drafters).
    out = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8, 1, 2, 5, 6, 7, 8, 5, 6]
    prompt = [3, 5, 6, 4]
    reqs = requests_of("run", [_line("x", "a", prompt, out, 0.0)])
    for k in (1, 2, 4):
        got = replay_engines(reqs, "suffix", k_for_batch(k))["run"]["x"]
        ref = replay_group([ReplaySample("g", 0, tuple(prompt), tuple(out))],
                           ReplayConfig("suffix", k, "own"))[0]  # fmt: skip
        assert got.accepted == (len(out) - 1) - ref.decode_steps
        assert got.accepted > 0


def test_the_workers_k_table_and_the_replayed_acceptance_reach_the_simulator() -> None:
    spec = parse_fidelity_speculation("suffix:1-2:4,3-64:2", "smollm2")
    assert spec.by_batch_size == ((1, 2, 4), (3, 64, 2))
    workload = load_workload("fidelity")
    scripts = generate(workload, 0)[:8]
    cluster = fidelity_cluster(load_profile("vllm-cpu-tiny"), 2, 8)
    makespan, tokens = {}, {}
    for tau in (1.0, 2.0):
        sim_spec = fidelity_speculation(spec, "verl", {s.id: tau for s in scripts})
        assert sim_spec.k_by_batch_size == ((2, 4), (64, 2))
        assert sim_spec.config.num_speculative_tokens is None
        result = Simulator(
            scripts, cluster, get_policy("verl"), config=SimConfig(speculation=sim_spec),
            tool_means_s={t.name: t.latency_s.median for t in workload.tools},
        ).run()  # fmt: skip
        makespan[tau], tokens[tau] = result.makespan_s, result.speculation["tokens_per_step"]
        # Four trajectories per engine: K 2 from the table, never Heddle's own choice.
        assert set(result.speculation["k_segments"]) <= {"2", "4"}
    assert tokens == pytest.approx({1.0: 1.0, 2.0: 2.0})
    assert makespan[2.0] < makespan[1.0]
    heddle = fidelity_speculation(spec, "heddle", {})
    assert heddle.seed_siblings and heddle.colocate_groups  # as the live session runs


@pytest.mark.parametrize(
    ("text", "model", "words"),
    [("auto", "smollm2", "auto's table"), ("suffix:4", None, "--model smollm2"),
     ("suffix:x", "smollm2", "METHOD:K")],
)  # fmt: skip
def test_bad_speculation_is_one_sentence(text: str, model: str | None, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_fidelity_speculation(text, model)
    assert parse_fidelity_speculation(None, None) == Speculation()


def test_the_cli_refuses_speculation_on_sim_workers_before_starting_any(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fid"
    argv = ["bench", "fidelity", "--engine", "sim", "--model", "smollm2",
            "--speculation", "suffix:4", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "needs --engine vllm" in err and len(err.strip().splitlines()) == 1
    assert not (out / "logs").exists()  # no worker was started


def test_the_table_gives_tokens_per_step_real_replayed_and_simulated() -> None:
    row = {
        "real_median_makespan_s": 50.0, "real_min_makespan_s": 45.0,
        "real_max_makespan_s": 55.0, "sim_makespan_s": 52.0,
        "sim_scripted_makespan_s": 51.0, "error": 0.04, "real_tokens_per_step": 1.17,
        "replay_tokens_per_step": 1.15, "sim_tokens_per_step": 1.16,
        "replay_error_median_abs": 0.03, "trajectories_compared": 36,
    }  # fmt: skip
    result = {
        "workload": "w", "trajectories": 12, "workers": 2, "max_num_seqs": 4, "rounds": 3,
        "profile": "vllm-cpu-smollm2", "policies": {"heddle": row, "verl": row},
        "real_ranking": ["heddle", "verl"], "sim_ranking": ["heddle", "verl"],
        "ranking_agrees": True, "within_target": True, "load_average_1m": [1.0, 2.0],
        "session_cpu_share": 0.05, "real_outside_engine_per_step_s": 0.1,
        "request_overhead_s": 0.05, "pairs_separated_by_real_run": 0,
        "pairs_simulator_orders_alike": 0, "model": "/models/smollm2",
        "speculation": {"method": "suffix", "num_speculative_tokens": 4,
                        "by_batch_size": [[1, 2, 4], [3, 64, 2]],
                        "acceptance": "replayed from the real run's tokens"},
    }  # fmt: skip
    text = format_fidelity(result)
    assert "speculation: suffix K 1-2:4,3-64:2" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("heddle") and "1.170" in x)
    assert "1.150" in line and "1.160" in line and "3.0%" in line
