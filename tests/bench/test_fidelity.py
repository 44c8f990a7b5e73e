"""``heddle bench fidelity`` end to end on simulated workers that run the shipped profile in
real time: real worker processes, the real session over HTTP, real tool sleeps, against
the simulator on the same profile. Both sides model the same engine, so they must agree
closely; a gap here is the session's or the simulator's own error, not the profile's."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from heddle.bench import (
    bench_engines,
    outside_engine_per_step,
    pairs_agree,
    replayed_acceptance,
    tokenized_scripts,
)
from heddle.rollout import LocalWorkerOptions, load_workload
from heddle.scheduler import generate
from heddle.worker import Speculation

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # real worker processes, about 30 s


def test_bench_fidelity_on_sim_workers_matches_the_simulator(tmp_path: Path) -> None:
    out = tmp_path / "fid"
    done = subprocess.run(
        [sys.executable, "-m", "heddle", "bench", "fidelity", "--engine", "sim",
         "--prompts", "2", "--rounds", "1", "--policies", "heddle,verl", "--out", str(out)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ranking (fastest first)" in done.stdout
    result = json.loads((out / "fidelity.json").read_text())
    assert result["trajectories"] == 8 and set(result["policies"]) == {"heddle", "verl"}
    for name, row in result["policies"].items():
        # The sim workers add HTTP, the session's loop and asyncio timers to the simulator's
        # engine; on a loaded 2-core machine that stays well under 15%.
        assert abs(row["error"]) < 0.15, (name, row)
    # Prompts and tool replies reach the engine longer than scripted (the chat template).
    assert result["tokenization"]["trajectories_matched"] == 8
    assert result["tokenization"]["prompt_extra_tokens"] > 0
    assert 0 <= result["real_outside_engine_per_step_s"] < 1.0


def test_tokenized_scripts_take_the_engines_counts_and_pairs_need_separation() -> None:
    scripts = generate(load_workload("fidelity"), 1)[:2]
    records = [
        {"task_index": 0, "sample": i, "tokens": {"prompt": s.prompt_tokens + 20},
         "trace": {"tool_output_tokens": [n + 5 for n in s.tool_output_tokens]}}
        for i, s in enumerate(scripts)
    ]  # fmt: skip
    fixed, extra = tokenized_scripts(scripts, records, samples=4)
    assert [s.prompt_tokens for s in fixed] == [s.prompt_tokens + 20 for s in scripts]
    assert extra["prompt_extra_tokens"] == 20 and extra["trajectories_matched"] == 2
    row = {"real_min_makespan_s": 10.0, "real_max_makespan_s": 11.0, "sim_makespan_s": 10.0}
    apart = {"real_min_makespan_s": 12.0, "real_max_makespan_s": 13.0, "sim_makespan_s": 9.0}
    close = {"real_min_makespan_s": 10.5, "real_max_makespan_s": 12.0, "sim_makespan_s": 9.0}
    assert pairs_agree({"a": row, "b": apart}) == (1, 0)  # separated, ordered the other way
    assert pairs_agree({"a": row, "b": close}) == (0, 0)  # overlapping: noise, not counted


def test_time_outside_the_engine_is_what_neither_the_engine_nor_the_tool_took() -> None:
    records = [
        {"turns": 2, "timings": {"duration_s": 3.0, "tool_s": 1.0, "generate_s": 1.5}},
        {"turns": 4, "timings": {"duration_s": 5.0, "tool_s": 2.0, "generate_s": 2.2}},
        {"turns": 0, "timings": {"duration_s": 0.1, "tool_s": 0.0, "generate_s": 0.0}},
    ]
    assert outside_engine_per_step(records) == pytest.approx((0.25 + 0.2) / 2)


def test_outside_the_engine_core_uses_engine_s_and_the_mean_weighs_steps() -> None:
    records = [
        {"turns": 2, "timings": {"duration_s": 3.0, "tool_s": 1.0, "generate_s": 1.8,
                                 "engine_s": 1.5}},
        {"turns": 4, "timings": {"duration_s": 5.0, "tool_s": 2.0, "generate_s": 2.2}},
    ]  # fmt: skip
    assert outside_engine_per_step(records) == pytest.approx((0.25 + 0.2) / 2)
    assert outside_engine_per_step(records, mean=True) == pytest.approx((0.5 + 0.8) / 6)
    assert outside_engine_per_step([]) == 0.0


def test_the_replay_reads_every_runs_token_trace_keyed_by_script(tmp_path: Path) -> None:
    # The sim engine does not draft, but its runs write the token traces the replay
    # reads: every run, the warm-up included, and every trajectory under its script's id.
    workload = dataclasses.replace(
        load_workload(str(ROOT / "examples/speculation/engines-tail-small.yaml")), prompts=1
    )
    options = LocalWorkerOptions(
        engine="sim", max_model_len=1 << 20, max_num_seqs=4, time_scale=0.0,
        log_dir=tmp_path / "logs",
    )  # fmt: skip
    bench_engines(
        workload=workload, policies=["verl"], options=options, tps=[1, 1], samples=4,
        rounds=1, seed=0, tool_time_scale=0.0, out=tmp_path, progress=lambda _: None,
    )  # fmt: skip
    assert not (tmp_path / "runs" / "verl-r0.trace.jsonl").exists()  # only when asked
    bench_engines(
        workload=workload, policies=["verl"], options=options, tps=[1, 1], samples=4,
        rounds=1, seed=0, tool_time_scale=0.0, out=tmp_path, progress=lambda _: None,
        trace=True,
    )  # fmt: skip
    assert (tmp_path / "runs" / "warmup.trace.jsonl").is_file()
    scripts = generate(workload, 0)
    got = replayed_acceptance(tmp_path, ["verl"], 1, scripts, 4, Speculation.of("suffix", 4))
    verl = got["verl"]
    assert set(verl["replayed"]) == {s.id for s in scripts}
    assert all(tau >= 1.0 for tau in verl["replayed"].values())
    # The sim workers count no drafts: nothing measured to compare the replay with.
    assert verl["real_tokens_per_step"] == 1.0 and verl["trajectories_compared"] == 0
