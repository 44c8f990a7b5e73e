"""What local workers draft with, as the start-up decisions and the drafts feed see it."""

from __future__ import annotations

import pytest

from heddle.rollout import LocalWorkerOptions, local_speculation
from heddle.rollout._colocation import sim_speculation_for
from heddle.worker import Speculation


@pytest.fixture
def cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stands in for vLLM's CPU build being what a local worker imports."""
    monkeypatch.setattr("heddle.rollout._local.is_cpu_build", lambda: True)


@pytest.mark.usefixtures("cpu_build")
def test_auto_on_the_cpu_build_is_off_for_the_decisions_too() -> None:
    options = LocalWorkerOptions(engine="vllm", model="m", speculation=Speculation("auto"))
    spec = local_speculation(options)
    assert not spec.on
    # The co-location and shape decisions then simulate no drafting at all.
    assert sim_speculation_for(spec) is None
    assert sim_speculation_for(options.speculation) is not None  # what they did before


@pytest.mark.usefixtures("cpu_build")
def test_a_given_method_or_table_stays_as_the_pool_gave_it() -> None:
    for given in (Speculation("suffix", 2), Speculation.of("auto", None, ((1, 4, 2), (5, 64, 0)))):
        options = LocalWorkerOptions(engine="vllm", model="m", speculation=given)
        assert local_speculation(options) == given


def test_auto_where_a_worker_would_draft_stays_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    # A GPU build here: each worker builds its own table at its TP; the decisions do so too.
    monkeypatch.setattr("heddle.rollout._local.is_cpu_build", lambda: False)
    auto = Speculation("auto")
    options = LocalWorkerOptions(engine="vllm", model="Qwen/Qwen3-8B", speculation=auto)
    assert local_speculation(options) == Speculation("auto")
    # Simulated workers take the pool's speculation as it is.
    sim = LocalWorkerOptions(engine="sim", speculation=Speculation("auto"))
    assert local_speculation(sim) == Speculation("auto")
