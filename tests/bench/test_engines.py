"""``heddle bench engines``: baselines with an in-flight cap, and the regime check."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from heddle.bench import parse_worker_speculation
from heddle.bench._session import bench_engines, parse_policy_cap
from heddle.exceptions import ConfigError
from heddle.rollout import LocalWorkerOptions, load_workload


def test_a_policy_name_may_carry_an_in_flight_cap_per_engine() -> None:
    assert parse_policy_cap("verl") == ("verl", None)
    assert parse_policy_cap("slime@16") == ("slime", 16)
    for bad in ("verl@", "verl@0", "verl@x"):
        with pytest.raises(ConfigError, match="NAME@N"):
            parse_policy_cap(bad)


def _bench_on_sim_workers(
    tmp_path: Path, policies: list[str], *, prompts: int, seed: int
) -> dict[str, Any]:
    """One round of ``heddle bench engines`` on two TP1 sim workers at no time scale."""
    workload = dataclasses.replace(load_workload("quickstart"), prompts=prompts)
    options = LocalWorkerOptions(
        engine="sim", time_scale=0.0, max_model_len=1 << 20, log_dir=tmp_path / "logs"
    )
    return bench_engines(
        workload=workload,
        policies=policies,
        options=options,
        tps=[1, 1],
        samples=workload.samples_per_prompt,
        rounds=1,
        seed=seed,
        tool_time_scale=0.0,
        out=tmp_path,
        progress=lambda _: None,
    )


def test_a_capped_baseline_runs_beside_heddle_on_the_same_sim_workers(tmp_path: Path) -> None:
    result = _bench_on_sim_workers(tmp_path, ["heddle", "verl@1"], prompts=2, seed=1)
    assert set(result["policies"]) == {"heddle", "verl@1"}
    assert set(result["throughput_ratios"]) == {"heddle/verl@1"}
    row = result["runs"]["verl@1"][0]
    assert row["done"] == 8 and row["failed"] == 0
    # The regime check: the longest trajectory's own wall time, against the makespan.
    assert 0 < row["longest_wall_s"] <= row["longest_finish_s"] <= row["makespan_s"] + 1e-6
    assert row["longest_generated_tokens"] > 0
    assert (tmp_path / "runs" / "verl-cap1-r0.jsonl").exists()
    # The tail per policy, and the workers' speculation (off: no draft counts).
    assert result["policies"]["verl@1"]["median_longest_wall_s"] == row["longest_wall_s"]
    assert result["speculation"]["method"] == "off" and "drafted_tokens" not in row


def test_the_warm_up_runs_the_measured_workload_so_every_run_finds_the_same_cache(
    tmp_path: Path,
) -> None:
    """vLLM's prefix cache outlives a run: each measured run finds the texts of the run
    before it. The warm-up is that run for the first one: the same tasks, samples and
    seed, so the same prompts and the same scripted turns (a warm-up on other tasks left
    the first policy alone to prefill its prompts cold: docs/speculation.md)."""
    _bench_on_sim_workers(tmp_path, ["verl"], prompts=3, seed=3)
    samples = load_workload("quickstart").samples_per_prompt

    def shape(name: str) -> dict[tuple[str, int], tuple[list[int], list[int]]]:
        rows = [json.loads(line) for line in (tmp_path / "runs" / name).read_text().splitlines()]
        return {
            (r["task_id"], r["sample"]): (r["prompt_token_ids"], r["trace"]["turn_tokens"])
            for r in rows
        }

    measured = shape("verl-r0.jsonl")
    assert len(measured) == 3 * samples
    assert shape("warmup.jsonl") == measured


def test_the_workers_speculation_is_one_setting_for_every_policy() -> None:
    assert not parse_worker_speculation("off").on
    fixed = parse_worker_speculation("suffix:2")
    assert (fixed.method, fixed.num_speculative_tokens, fixed.by_batch_size) == ("suffix", 2, ())
    table = parse_worker_speculation("suffix:1-4:4,5-64:2")
    assert table.by_batch_size == ((1, 4, 4), (5, 64, 2)) and table.num_speculative_tokens == 4
    assert parse_worker_speculation("ngram").num_speculative_tokens == 4
    for bad, says in (
        ("suffix:x", "METHOD:K"),
        ("draft:4", "not a method"),
        ("suffix:4-1:2", "1 <="),
    ):
        with pytest.raises(ConfigError, match=says):
            parse_worker_speculation(bad)
