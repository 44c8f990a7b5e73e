"""Weights in place on a real vLLM worker (CPU build): two random-weight tiny checkpoints.

Skipped only when vLLM is not installed; `.ci/run` installs it, so CI runs these.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from .._vllm import require_vllm
from .test_process import free_port
from .test_vllm import start_worker, wait_ready

pytestmark = pytest.mark.slow

require_vllm()


@pytest.fixture(scope="module")
def swap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Path]]]:
    """One vLLM worker started on checkpoint a; b has other random weights, c another depth."""
    from heddle.worker._tiny_model import write_tiny_model

    root = tmp_path_factory.mktemp("ckpt")
    paths = {
        "a": write_tiny_model(root / "a", seed=0),
        "b": write_tiny_model(root / "b", seed=1),
        "c": write_tiny_model(root / "c", seed=2, layers=3),
    }
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_worker(paths["a"], port, f"--weights-root={root}")
    try:
        wait_ready(proc, url)
        yield url, paths
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def greedy(url: str, tid: str) -> dict[str, object]:
    """The same prompt and seed every time: only the weights can change the tokens."""
    body = {
        "append_token_ids": list(range(10, 60)),
        "sampling": {"max_tokens": 12, "temperature": 0.0, "seed": 3, "ignore_eos": True},
        "reset": True,
    }
    answer = httpx.post(f"{url}/v1/trajectories/{tid}/generate", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    result: dict[str, object] = answer.json()
    return result


def load(url: str, path: Path, version: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/weights", json={"path": str(path), "version": version}, timeout=120
    )


def test_swapped_weights_change_the_tokens_and_the_reported_version(
    swap: tuple[str, dict[str, Path]],
) -> None:
    url, paths = swap
    on_a = greedy(url, "x")
    assert greedy(url, "x")["token_ids"] == on_a["token_ids"]  # deterministic on one checkpoint
    assert greedy(url, "y")["cached_tokens"] == 32  # the prompt's full block is cached
    loaded = load(url, paths["b"], "step-1")
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["loaded"] is True and loaded.json()["load_s"] > 0
    state = httpx.get(f"{url}/v1/state").json()
    assert (state["weight_version"], state["weights_path"]) == ("step-1", str(paths["b"]))
    assert state["ready"] is True
    on_b = greedy(url, "z")
    assert on_b["token_ids"] != on_a["token_ids"]
    assert on_b["cached_tokens"] == 0  # blocks computed with the old weights were dropped
    metrics = httpx.get(f"{url}/metrics").text
    assert f'heddle_worker_weights_info{{path="{paths["b"]}",version="step-1"}} 1.0' in metrics
    # Back to a: the very same tokens again, so the load replaced every weight exactly.
    assert load(url, paths["a"], "step-0").status_code == 200
    assert greedy(url, "w")["token_ids"] == on_a["token_ids"]


def test_a_checkpoint_of_another_model_is_refused_and_the_old_one_keeps_serving(
    swap: tuple[str, dict[str, Path]],
) -> None:
    url, paths = swap
    assert load(url, paths["b"], "step-1").status_code == 200
    on_b = greedy(url, "b1")
    deeper = load(url, paths["c"], "step-2")
    assert deeper.status_code == 422
    error = deeper.json()["error"]
    assert f"checkpoint {paths['c']}" in error and "layers.2" in error
    assert "keeps serving weights version 'step-1'" in error
    missing = load(url, paths["a"].parent / "nope", "step-3")
    assert missing.status_code == 422 and "does not exist" in missing.json()["error"]
    state = httpx.get(f"{url}/v1/state").json()
    assert state["weight_version"] == "step-1" and state["ready"] is True
    assert greedy(url, "b2")["token_ids"] == on_b["token_ids"]


def test_a_load_that_keeps_a_step_in_flight_pauses_and_resumes_it(
    swap: tuple[str, dict[str, Path]],
) -> None:
    """mode keep on vLLM: pause_generation(keep), reload, resume. The step in flight is
    neither waited for nor aborted: it ends whole; the old prefixes go once it has ended."""
    url, paths = swap
    body = {
        "append_token_ids": list(range(10, 60)),
        "sampling": {"max_tokens": 300, "temperature": 0.0, "ignore_eos": True},
        "reset": True,
    }
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(httpx.post, f"{url}/v1/trajectories/kept/generate", json=body,
                           timeout=300)  # fmt: skip
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/v1/state").json()["running"] == 0:
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.02)
        loaded = httpx.post(
            f"{url}/v1/weights",
            json={"path": str(paths["a"]), "version": "kept-1", "mode": "keep"},
            timeout=120,
        )
        answer = long.result()
    assert loaded.status_code == 200, loaded.text
    assert (loaded.json()["kept"], loaded.json()["drained_s"]) == (1, 0.0)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["token_ids"]) == 300 and answer.json()["finish_reason"] == "length"
    time.sleep(0.3)  # the reset is retried every 50 ms once no kept request holds blocks
    assert greedy(url, "after-keep")["cached_tokens"] == 0
    assert httpx.get(f"{url}/v1/state").json()["weight_version"] == "kept-1"
