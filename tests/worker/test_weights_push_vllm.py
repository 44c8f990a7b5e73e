"""Weights pushed over gloo into a real vLLM worker (CPU build, the tiny model).

The reference for every push is the same weights loaded from disk (``POST
/v1/weights``), so a push must give exactly the greedy tokens and logprobs those
give: a full push of another checkpoint, and a delta that changes one member of a
fused module (q_proj inside vLLM's qkv_proj: k and v must come back whole).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.client import changed_tensors, push_weights
from heddle.worker import WorkerEndpoint

from .._vllm import require_vllm
from .test_process import free_port
from .test_vllm import start_worker, wait_ready

pytestmark = pytest.mark.slow

require_vllm()

Q0 = "model.layers.0.self_attn.q_proj.weight"


def _state(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(str(path / "model.safetensors")))


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Path]]]:
    """One vLLM worker on checkpoint a; b has other weights; c is b with layer 0's q_proj
    perturbed deterministically (saved, so the disk reload gives the reference)."""
    from safetensors.torch import save_file

    from heddle.worker._tiny_model import write_tiny_model

    root = tmp_path_factory.mktemp("push")
    paths = {"a": write_tiny_model(root / "a", seed=0), "b": write_tiny_model(root / "b", seed=1)}
    c = root / "c"
    shutil.copytree(paths["b"], c)
    state = _state(paths["b"])
    state[Q0] = (state[Q0].float() * -1.5 + 0.01).to(state[Q0].dtype)
    save_file(state, str(c / "model.safetensors"), metadata={"format": "pt"})
    paths["c"] = c
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_worker(paths["a"], port, f"--weights-root={root}")
    try:
        wait_ready(proc, url, timeout_s=600)  # the shared 2 cores can be slow to start it
        yield url, paths
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def greedy(url: str, tid: str, **extra: Any) -> httpx.Response:
    body = {
        "append_token_ids": list(range(10, 60)),
        "sampling": {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True, "logprobs": True},
        "reset": True,
        **extra,
    }
    return httpx.post(f"{url}/v1/trajectories/{tid}/generate", json=body, timeout=120)


def tokens(url: str, tid: str) -> tuple[list[int], list[float]]:
    answer = greedy(url, tid)
    assert answer.status_code == 200, answer.text
    return answer.json()["token_ids"], answer.json()["logprobs"]


def load(url: str, path: Path, version: str) -> None:
    answer = httpx.post(f"{url}/v1/weights", json={"path": str(path), "version": version},
                        timeout=120)  # fmt: skip
    assert answer.status_code == 200, answer.text


def push(url: str, state: dict[str, Any], version: str, **kw: Any) -> dict[str, Any]:
    [result] = asyncio.run(push_weights([WorkerEndpoint("w", url)], state, version, **kw))
    return result


def test_pushed_weights_give_exactly_the_tokens_of_the_same_weights_from_disk(
    pushed: tuple[str, dict[str, Path]],
) -> None:
    url, paths = pushed
    load(url, paths["b"], "disk-b")
    on_b = tokens(url, "ref-b")
    load(url, paths["c"], "disk-c")
    on_c = tokens(url, "ref-c")
    load(url, paths["a"], "disk-a")
    on_a = tokens(url, "ref-a")
    assert on_a[0] != on_b[0]
    assert on_b[1] != on_c[1]  # c's q_proj moves the logprobs (greedy tokens may agree)

    state_b = _state(paths["b"])
    full = push(url, state_b, "push-b", timeout_s=60)
    assert (full["status"], full["delta"], full["tensors"]) == ("loaded", False, len(state_b))
    assert full["bytes"] == sum(t.numel() * t.element_size() for t in state_b.values())
    state = httpx.get(f"{url}/v1/state").json()
    assert state["weight_version"] == "push-b" and state["ready"] is True
    after = greedy(url, "push-b", weight_version="push-b")
    assert after.status_code == 200, after.text
    assert after.json()["cached_tokens"] == 0  # the prefixes cached under a are gone
    assert (after.json()["token_ids"], after.json()["logprobs"]) == (on_b[0], on_b[1])
    stale = greedy(url, "stale", weight_version="disk-a")
    assert stale.status_code == 421 and "serves weights version 'push-b'" in stale.text

    # A delta of one tensor (b -> c): vLLM's qkv_proj is rebuilt from q (sent) and k, v
    # (the plan adds them); the result is c's tokens exactly, with a step kept in flight.
    state_c = _state(paths["c"])
    changed = changed_tensors(state_c, state_b)
    assert changed == [Q0]
    long_body = {
        "append_token_ids": list(range(70, 90)),
        "sampling": {"max_tokens": 200, "temperature": 0.0, "ignore_eos": True},
        "reset": True,
    }
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(httpx.post, f"{url}/v1/trajectories/kept/generate", json=long_body,
                           timeout=300)  # fmt: skip
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/v1/state").json()["running"] == 0:
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.02)
        delta = push(url, state_c, "push-c", changed=changed, timeout_s=60)
        kept = long.result()
    assert (delta["status"], delta["delta"], delta["tensors"]) == ("loaded", True, 3)
    assert delta["kept"] == 1 and delta["stall_s"] > 0
    assert kept.status_code == 200 and len(kept.json()["token_ids"]) == 200
    time.sleep(0.3)  # the prefix-cache reset is retried once the kept step let go of its blocks
    after_c = greedy(url, "push-c", weight_version="push-c").json()
    assert after_c["cached_tokens"] == 0
    assert (after_c["token_ids"], after_c["logprobs"]) == (on_c[0], on_c[1])


def test_a_push_that_does_not_fit_leaves_the_served_weights_alone(
    pushed: tuple[str, dict[str, Path]],
) -> None:
    url, paths = pushed
    load(url, paths["a"], "disk-a2")
    before = tokens(url, "before")
    state = _state(paths["b"])
    state[Q0] = state[Q0][:, :64]
    answer = httpx.post(
        f"{url}/v1/weights/push",
        json={
            "version": "bad",
            "tensors": [{"name": Q0, "shape": list(state[Q0].shape), "dtype": "bfloat16"}],
            "group": {"address": "127.0.0.1", "port": free_port(), "world_size": 2, "rank": 1},
            "delta": True,
        },
    )
    assert answer.status_code == 422
    assert f"tensor {Q0} has shape [128, 64], the running model's has [128, 128]" in answer.text
    assert httpx.get(f"{url}/v1/state").json()["weight_version"] == "disk-a2"
    assert tokens(url, "after") == before
