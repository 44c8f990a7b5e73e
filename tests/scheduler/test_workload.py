"""Workload files: presets parse, generation is deterministic, errors name the field."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest

from heddle.exceptions import WorkloadError
from heddle.rollout import WORKLOAD_PRESETS, load_cluster, load_workload
from heddle.scheduler import ClusterSpec, TrajectoryScript, WorkloadSpec, generate


@functools.cache
def _generated(name: str, seed: int) -> tuple[TrajectoryScript, ...]:
    """A preset's scripts, drawn once per test process (8,192 of them take seconds)."""
    return tuple(generate(load_workload(name), seed))


@pytest.mark.slow
@pytest.mark.parametrize("name", WORKLOAD_PRESETS)
def test_presets_parse_and_generate(name: str) -> None:
    spec = load_workload(name)
    scripts = _generated(name, 0)  # the seed the other tests draw them with: drawn once
    assert len(scripts) == spec.trajectories
    for s in scripts[:200]:
        assert 1 <= s.total_tokens <= spec.max_output_tokens
        assert 1 <= s.turns <= spec.max_turns
        assert len(s.tool_latency_s) == len(s.tool_names) == s.turns - 1
        assert all(x >= 1 for x in s.turn_tokens)


def test_the_paper_tool_latencies_hold_on_average() -> None:
    for name, mean in (("coding", 0.41), ("search", 1.41), ("math", 0.046)):
        latencies = [x for s in _generated(name, 0) for x in s.tool_latency_s]
        assert np.mean(latencies) == pytest.approx(mean, rel=0.1), name


def test_generation_is_deterministic_under_a_seed() -> None:
    # Prompts are drawn in order, so the first 4 prompts' 64 scripts are the whole preset's
    # first 64: comparing them needs only those drawn.
    spec = dataclasses.replace(load_workload("math"), prompts=4)
    assert generate(spec, 7)[:50] == generate(spec, 7)[:50]
    assert generate(spec, 7)[:50] != generate(spec, 8)[:50]
    assert generate(spec, 0)[:50] == list(_generated("math", 0)[:50])  # the preset's own


def test_long_tail_and_sibling_correlation_as_configured() -> None:
    spec = load_workload("coding")
    scripts = _generated("coding", 0)
    totals = np.array([s.total_tokens for s in scripts])
    assert totals.max() == spec.max_output_tokens  # the tail reaches the cap
    assert np.median(totals) == pytest.approx(spec.output_median, rel=0.15)
    logs = np.log(totals).reshape(spec.prompts, spec.samples_per_prompt)
    icc = logs.mean(axis=1).var() / logs.var()
    expected = spec.group_sigma**2 / (spec.group_sigma**2 + spec.within_sigma**2)
    assert icc == pytest.approx(expected, abs=0.1)


def test_flat_workload_has_no_tail() -> None:
    totals = np.array([s.total_tokens for s in _generated("flat", 0)])
    assert totals.max() / np.median(totals) < 2.0


def minimal() -> dict[str, object]:
    return {
        "name": "w",
        "prompts": 2,
        "samples_per_prompt": 2,
        "output_tokens": {"median": 100, "max": 1000},
        "turns": {"median": 2},
        "tools": [{"name": "t", "latency_s": {"mean": 0.1}}],
    }


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d.pop("tools"), r"missing field\(s\) \['tools'\]"),
        (lambda d: d.update(promts=3), r"1 unknown field\(s\); valid fields are"),
        (lambda d: d.update(prompts=0), r"workload.prompts: below the minimum 1"),
        (lambda d: d.update(prompts=2.5), r"prompts: expected a whole number, got a fraction"),
        (lambda d: d.update(prompts="many"), r"prompts: expected a finite number, got a str"),
        (lambda d: d.update(tools=[]), r"workload.tools: expected a non-empty list"),
        (lambda d: d["tools"][0].pop("latency_s"), r"workload.tools\[0\]: missing field"),
        (
            lambda d: d.update(output_tokens={"median": 1, "max": 10, "sigma": 1}),
            r"workload.output_tokens: 1 unknown field\(s\)",
        ),
        (
            lambda d: d.update(prompt_tokens={"median": 100, "min": 50, "max": 10}),
            r"prompt_tokens: max is below min",
        ),
    ],
)
def test_malformed_workloads_say_what_is_wrong(mutate: object, message: str) -> None:
    data = minimal()
    mutate(data)  # type: ignore[operator]
    with pytest.raises(WorkloadError, match=message):
        WorkloadSpec.from_dict(data)


def test_cluster_preset_and_errors() -> None:
    cluster = load_cluster("64xh100")
    assert cluster.gpus == 64 and cluster.baseline_shape().num_instances == 64
    assert not math.isnan(cluster.perf_model().per_token_s(1))
    with pytest.raises(WorkloadError, match="unknown model 'llama'; choose one of"):
        ClusterSpec.from_dict({"name": "c", "gpus": 8, "model": "llama"})
    with pytest.raises(WorkloadError, match="baseline_tp=2 is not among"):
        ClusterSpec.from_dict(
            {
                "name": "c",
                "gpus": 8,
                "model": "qwen3-8b",
                "tensor_parallel_sizes": [1],
                "baseline_tp": 2,
            }
        )
    with pytest.raises(WorkloadError, match="neither a preset"):
        load_workload("no-such-workload")
