"""Shared fixtures. Nothing here fakes a component: they build real scheduler objects."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from heddle.rollout import STATE_DIR_ENV
from heddle.scheduler import HARDWARE_PRESETS, MODEL_PRESETS, EngineInstance, PerfModel

# Real worker processes and a real tool server, for the rollout's and the operator's tests.
from ._rollout_fixtures import (
    _shared_scripted_pool,
    _shared_sim_pool,
    scripted_pool,
    sim_pool,
    tool_server,
)

__all__ = [
    "_shared_scripted_pool",
    "_shared_sim_pool",
    "scripted_pool",
    "sim_pool",
    "tool_server",
]


@pytest.fixture(autouse=True)
def own_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test keeps its previous rollouts and decisions to itself (HEDDLE_STATE_DIR,
    which the processes it starts inherit): none carries over from another test."""
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def perf() -> PerfModel:
    """The paper's setting: Qwen3-14B on H100s, batch cap 100."""
    return PerfModel(MODEL_PRESETS["qwen3-14b"], HARDWARE_PRESETS["h100-sxm"])


def make_instance(
    name: str, per_token_s: float = 1.0, cap: int = 4, alpha: float = 0.25, tp: int = 1
) -> EngineInstance:
    """A synthetic instance with a linear interference curve F(b) = 1 + alpha (b - 1)."""
    slowdown = (0.0, *(1.0 + alpha * (b - 1) for b in range(1, cap + 1)))
    return EngineInstance(name, tp, per_token_s, 10**6, cap, slowdown)


# CI runs the property tests with a fixed seed so a red run can be replayed;
# locally hypothesis explores new examples every time.
if os.environ.get("CI"):
    settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
    settings.load_profile("ci")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--e2e",
        action="store_true",
        default=False,
        help="also run tests/e2e against the cluster in KUBECONFIG (needs GPUs and the CRDs)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--e2e"):
        return
    skip = pytest.mark.skip(reason="end-to-end against a real cluster: run with --e2e")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)
