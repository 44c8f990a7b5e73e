"""The profiled performance model: it loads, fits, interpolates monotonically, and the
simulator runs on it (its lower bound holding) with no change to the policies."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from heddle.exceptions import ConfigError, WorkloadError
from heddle.rollout import load_cluster, load_workload
from heddle.scheduler import (
    ClusterSpec,
    EngineProfile,
    ProfiledPerfModel,
    fit_decode,
    fit_prefill,
    generate,
    get_policy,
    load_profile,
)
from heddle.scheduler.sim import Simulator, lower_bound


def _profile_dict() -> dict[str, Any]:
    # A made-up engine: 4 ms + 0.5 ms per sequence + 1 us per context token, measured with
    # +-20% noise alternating over the points (as on a shared CPU).
    grid = [(b, b * c) for b in (1, 2, 4, 8) for c in (64, 512, 2048)]
    points = [
        (b, ctx, (0.004 + 0.0005 * b + 1e-6 * ctx) * (1.2 if i % 2 else 0.8))
        for i, (b, ctx) in enumerate(grid)
    ]
    decode = fit_decode(points)
    prefill = fit_prefill([(n, 0.003 + 2e-5 * n) for n in (16, 128, 1024, 3000)])
    return {
        "format": "heddle-engine-profile/1",
        "name": "made-up",
        "model": {"name": "tiny", "params_billion": 1e-4, "num_layers": 2, "hidden_size": 128,
                  "num_kv_heads": 2, "head_dim": 64},
        "kv_capacity_tokens": {"1": 100_000},
        "decode": {"1": {"batch_sizes": list(decode.batch_sizes), "fixed_s": list(decode.fixed_s),
                         "per_context_token_s": list(decode.per_context_token_s)}},
        "prefill": {"1": {"fixed_s": prefill.fixed_s, "per_token_s": prefill.per_token_s,
                          "per_token_squared_s": prefill.per_token_squared_s}},
    }  # fmt: skip


def _model(batch_cap: int = 8) -> ProfiledPerfModel:
    return ProfiledPerfModel.from_profile(EngineProfile.from_dict(_profile_dict()), batch_cap)


def test_fit_recovers_the_engine_through_noise_and_is_monotone() -> None:
    perf = _model()
    assert perf.iteration_time(1, 512, 1) == pytest.approx(0.0045 + 512e-6, rel=0.1)
    assert perf.iteration_time(8, 8 * 512, 1) == pytest.approx(0.008 + 8 * 512e-6, rel=0.1)
    between = perf.iteration_time(3, 3 * 512, 1)
    assert perf.iteration_time(2, 3 * 512, 1) <= between <= perf.iteration_time(4, 3 * 512, 1)
    times = [perf.iteration_time(b, 1000, 1) for b in range(1, 17)]
    assert times == sorted(times)  # beyond 8 it extrapolates, still nondecreasing
    contexts = [perf.iteration_time(4, c, 1) for c in (0, 100, 1000, 10_000)]
    assert contexts == sorted(contexts) and contexts[0] < contexts[-1]
    assert perf.prefill_time(0, 1) == 0.0
    assert perf.prefill_time(1000, 1) == pytest.approx(0.003 + 2e-5 * 1000, rel=1e-3)
    # A fit never goes negative, whatever the noise says.
    flat = fit_decode([(1, 100.0, 0.01), (1, 3000.0, 0.005), (2, 200.0, 0.01)])
    assert min(flat.fixed_s) >= 0 and min(flat.per_context_token_s) >= 0
    assert perf.kv_capacity_tokens(1) == 100_000 and perf.kv_capacity_tokens(2) == 0


def test_segment_time_is_the_sum_of_its_iterations_and_inverts() -> None:
    perf = _model()
    steps = sum(perf.iteration_time(3, 900 + 3 * i, 1) for i in range(50))
    assert perf.segment_time(3, 900, 1, 50) == pytest.approx(steps, rel=1e-9)
    assert perf.iterations_within(3, 900, 1, steps * (1 + 1e-9)) == 50
    assert perf.iterations_within(3, 900, 1, steps * 0.999) == 49


def test_unprofiled_tp_and_bad_files_get_a_sentence(tmp_path: Path) -> None:
    perf = _model()
    with pytest.raises(ConfigError, match="no measurements at TP2"):
        perf.iteration_time(1, 10, 2)
    with pytest.raises(WorkloadError, match="not an engine profile"):
        EngineProfile.from_dict({"format": "something else"})
    broken = _profile_dict()
    del broken["decode"]["1"]["fixed_s"]
    with pytest.raises(WorkloadError, match="malformed engine profile"):
        EngineProfile.from_dict(broken)
    with pytest.raises(WorkloadError, match="neither a shipped profile"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "p.json").write_text(json.dumps(_profile_dict()))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("name: c\ngpus: 2\ntensor_parallel_sizes: [1, 2]\nprofile: p.json\n")
    with pytest.raises(WorkloadError, match=r"measured TP \[1\] only, not \[2\]"):
        load_cluster(str(cluster))


def test_cluster_file_selects_the_profile_and_the_simulator_runs_on_it(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps(_profile_dict()))
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(
        "name: cpu\ngpus: 2\ntensor_parallel_sizes: [1]\nbatch_cap: 8\nprofile: p.json\n"
    )
    cluster = load_cluster(str(cluster_file))
    assert isinstance(cluster.perf_model(), ProfiledPerfModel)
    assert cluster.model == "tiny" and cluster.perf_model().batch_cap == 8
    spec = replace(load_workload("quickstart"), prompts=4)
    scripts = generate(spec, 3)
    bound = lower_bound(scripts, cluster).bound_s
    makespans = {}
    for name in ("heddle", "verl", "slime"):
        sim = Simulator(scripts, cluster, get_policy(name), tool_means_s={"sandbox": 0.4})
        makespans[name] = sim.run().makespan_s
        assert makespans[name] >= bound * (1 - 1e-9), (name, makespans[name], bound)
    assert all(m > 0 for m in makespans.values())


def test_gpu_presets_are_untouched() -> None:
    cluster = ClusterSpec("g", 8, 8, "qwen3-14b", "h100-sxm", (1, 2), 1)
    assert type(cluster.perf_model()).__name__ == "PerfModel"


def test_a_profiled_step_overhead_delays_every_step_and_the_datasheet_has_none() -> None:
    spec = replace(load_workload("quickstart"), prompts=1, samples_per_prompt=1)
    scripts = generate(spec, 5)
    makespans = []
    for overhead in (0.0, 0.25):
        profile = EngineProfile.from_dict({**_profile_dict(), "request_overhead_s": overhead})
        cluster = ClusterSpec("c", 1, 1, "tiny", "profiled", (1,), 1, 8, profile=profile)
        sim = Simulator(scripts, cluster, get_policy("verl"), tool_means_s={"sandbox": 0.4})
        makespans.append(sim.run().makespan_s)
    # One trajectory alone: each of its steps waits exactly the overhead once.
    assert makespans[1] - makespans[0] == pytest.approx(0.25 * scripts[0].turns, rel=1e-6)
    gpu = ClusterSpec("g", 8, 8, "qwen3-14b", "h100-sxm", (1, 2), 1)
    assert gpu.perf_model().step_overhead_s == 0.0
    with pytest.raises(WorkloadError, match="request_overhead_s"):
        EngineProfile.from_dict({**_profile_dict(), "request_overhead_s": -1})


def _measured(**overrides: float) -> dict[str, Any]:
    section: dict[str, Any] = {
        "isolated_median_s": 0.03,
        "rollout_mean_s": 0.2,
        "rollout_median_s": 0.1,
        "rollout_trajectories_per_worker": 32,
    }
    return {**section, **overrides}


def test_the_rollout_shaped_overhead_is_what_a_profile_without_a_figure_simulates() -> None:
    profile = EngineProfile.from_dict({**_profile_dict(), "step_overhead": _measured()})
    assert profile.step_overhead is not None
    assert profile.step_overhead.rollout_mean_s == 0.2
    assert profile.step_overhead.trajectories_per_worker == 32
    assert profile.request_overhead_s == 0.2  # the mean: a makespan adds steps up
    assert ProfiledPerfModel.from_profile(profile, 8).step_overhead_s == 0.2
    # A figure written out wins; a profile from before the section has none.
    explicit = {**_profile_dict(), "step_overhead": _measured(), "request_overhead_s": 0.05}
    assert EngineProfile.from_dict(explicit).request_overhead_s == 0.05
    assert EngineProfile.from_dict(_profile_dict()).step_overhead is None


def test_the_simulator_delays_every_step_by_the_measured_overhead() -> None:
    spec = replace(load_workload("quickstart"), prompts=1, samples_per_prompt=1)
    scripts = generate(spec, 5)
    makespans = []
    for section in (_measured(rollout_mean_s=0.0), _measured(rollout_mean_s=0.3)):
        profile = EngineProfile.from_dict({**_profile_dict(), "step_overhead": section})
        cluster = ClusterSpec("c", 1, 1, "tiny", "profiled", (1,), 1, 8, profile=profile)
        sim = Simulator(scripts, cluster, get_policy("verl"), tool_means_s={"sandbox": 0.4})
        makespans.append(sim.run().makespan_s)
    assert makespans[1] - makespans[0] == pytest.approx(0.3 * scripts[0].turns, rel=1e-6)


@pytest.mark.parametrize(
    "section",
    [
        _measured(rollout_mean_s=-0.1),
        _measured(isolated_median_s=float("nan")),
        _measured(rollout_trajectories_per_worker=0),
        {"rollout_mean_s": 0.2},
        "0.2",
    ],
)
def test_a_bad_step_overhead_section_gets_a_sentence(section: Any) -> None:
    with pytest.raises(WorkloadError, match=r"step_overhead|malformed engine profile"):
        EngineProfile.from_dict({**_profile_dict(), "step_overhead": section})


def test_the_shipped_cpu_profile_carries_its_rollout_shaped_overhead() -> None:
    profile = load_profile("vllm-cpu-tiny")
    assert profile.step_overhead is not None
    assert profile.request_overhead_s == profile.step_overhead.rollout_mean_s
    assert profile.step_overhead.rollout_mean_s >= profile.step_overhead.isolated_median_s


def test_the_rollout_decode_scale_multiplies_decode_only_and_bad_ones_get_a_sentence() -> None:
    plain = _model()
    scaled = ProfiledPerfModel.from_profile(
        EngineProfile.from_dict({**_profile_dict(), "decode_scale": 2.0}), 8
    )
    assert scaled.iteration_time(4, 2000, 1) == pytest.approx(2 * plain.iteration_time(4, 2000, 1))
    assert scaled.segment_time(4, 2000, 1, 30) == pytest.approx(
        2 * plain.segment_time(4, 2000, 1, 30)
    )
    assert scaled.decode_work_floor(100, 5000, 1) == pytest.approx(
        2 * plain.decode_work_floor(100, 5000, 1)
    )
    assert scaled.prefill_time(500, 1) == plain.prefill_time(500, 1)
    for bad in (0, -1.0, True, "2"):
        with pytest.raises(WorkloadError, match="decode_scale must be a number > 0"):
            EngineProfile.from_dict({**_profile_dict(), "decode_scale": bad})
