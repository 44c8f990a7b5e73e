"""Policies are chosen by name; unknown names list the valid ones."""

from __future__ import annotations

import pytest

from heddle.exceptions import ConfigError
from heddle.scheduler import (
    BASELINES,
    POLICIES,
    DPPlacement,
    FCFSOrdering,
    NoMigration,
    PerfModel,
    ProgressivePriority,
    SiblingPredictor,
    ToolWindowMigration,
    get_policy,
    make_migration,
    make_ordering,
    make_placement,
    make_predictor,
)


def test_every_policy_builds_its_components(perf: PerfModel) -> None:
    for policy in POLICIES.values():
        make_ordering(policy.ordering)
        make_placement(policy.placement)
        make_migration(policy.migration, perf)
        if policy.predictor and policy.predictor != "oracle":  # the simulator builds the oracle
            make_predictor(policy.predictor)


def test_heddle_and_baselines_are_what_design_md_says(perf: PerfModel) -> None:
    heddle = get_policy("heddle")
    assert isinstance(make_ordering(heddle.ordering), ProgressivePriority)
    assert isinstance(make_placement(heddle.placement), DPPlacement)
    assert isinstance(make_migration(heddle.migration, perf), ToolWindowMigration)
    assert isinstance(make_predictor(heddle.predictor or ""), SiblingPredictor)
    assert heddle.adaptive_shape
    for name in (*BASELINES, "fcfs"):
        baseline = get_policy(name)
        assert isinstance(make_ordering(baseline.ordering), FCFSOrdering)
        assert isinstance(make_migration(baseline.migration, perf), NoMigration)
        assert not baseline.adaptive_shape


def test_unknown_names_list_the_valid_ones(perf: PerfModel) -> None:
    with pytest.raises(ConfigError, match=r"unknown scheduling policy 'heddel'; choose one of \["):
        get_policy("heddel")
    with pytest.raises(ConfigError, match="unknown placement policy"):
        make_placement("random")
    with pytest.raises(ConfigError, match="unknown migration planner 'x'"):
        make_migration("x", perf)
