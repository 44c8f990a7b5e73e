"""One definition of a vLLM CPU worker's environment, for hand-started workers and `heddle run`'s.

The hand-started side is checked on a real vLLM worker in test_vllm.py (its
engine core's environment); here, the definition and `heddle run`'s pool.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from heddle.rollout import LocalPool, LocalWorkerOptions
from heddle.worker import THREADS_BIND, vllm_cpu_env

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_defaults_fill_only_what_the_environment_leaves_unset() -> None:
    assert vllm_cpu_env(range(2), {"PATH": "/bin"}) == {
        "PATH": "/bin",
        THREADS_BIND: "0|1",
        "HF_HUB_OFFLINE": "1",
    }
    chosen = {THREADS_BIND: "4-7", "HF_HUB_OFFLINE": "0"}
    assert vllm_cpu_env(range(1), chosen) == chosen


@pytest.mark.slow
async def test_heddle_runs_workers_get_the_same_defaults_on_the_cores_it_deals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(THREADS_BIND, "0-63")  # the pool's own binding must not reach every worker
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    pool = LocalPool([1, 1], LocalWorkerOptions(engine="sim", log_dir=tmp_path))
    try:
        await pool.start()
        envs = [proc.env for proc in pool.procs.values()]
    finally:
        await pool.stop()
    dealt = [str(i % (os.cpu_count() or 1)) for i in range(2)]  # round-robin, not inherited
    assert [env[THREADS_BIND] for env in envs] == dealt
    assert all(env["HF_HUB_OFFLINE"] == "1" for env in envs)
