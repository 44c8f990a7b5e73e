"""The worker on a real vLLM engine (CPU build) and a generated tiny model, over real HTTP.

Skipped only when vLLM is not installed; `.ci/run` installs it, so CI runs these.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from heddle.worker import THREADS_BIND

from .._vllm import require_vllm
from ._bad_requests import BAD_GENERATE_BODIES
from .test_process import free_port

pytestmark = pytest.mark.slow  # real processes or engines; `-m 'not slow'` skips them

require_vllm()

_MODEL_DIRS: list[Path] = []  # the module's tiny model, for tests that start their own worker
_PROCESSES: dict[str, subprocess.Popen[str]] = {}  # url -> worker process, for the SIGTERM test


def start_worker(
    model: Path, port: int, *extra: str, max_model_len: int | None = 2048
) -> subprocess.Popen[str]:
    """``heddle worker`` as a user starts it by hand (no binding of our own in its environment);
    ``max_model_len=None`` leaves the flag out (the model's own)."""
    env = {k: v for k, v in os.environ.items() if k != THREADS_BIND}
    length = [] if max_model_len is None else ["--max-model-len", str(max_model_len)]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "heddle",
            "worker",
            "--engine",
            "vllm",
            "--model",
            str(model),
            "--port",
            str(port),
            *length,
            "--block-size",
            "32",
            "--kv-cache-gib",
            "1",
            "--grace",
            "2",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def wait_ready(proc: subprocess.Popen[str], url: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the vLLM worker exited with {proc.returncode}:\n{output[-4000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the vLLM worker was not ready within {timeout_s} s")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Two real vLLM workers on one generated tiny model; the second has a batch cap of 1 and
    no --max-model-len (the model's own context)."""
    from heddle.worker._tiny_model import write_tiny_model

    model = write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    _MODEL_DIRS[:] = [model]
    ports = free_port(), free_port()
    procs = [
        start_worker(model, ports[0]),
        start_worker(model, ports[1], "--max-num-seqs", "1", max_model_len=None),
    ]
    urls = tuple(f"http://127.0.0.1:{p}" for p in ports)
    _PROCESSES.update(zip(urls, procs, strict=True))
    try:
        for proc, url in zip(procs, urls, strict=True):
            wait_ready(proc, url)
        yield urls[0], urls[1]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def generate(url: str, tid: str, body: dict[str, object]) -> dict[str, object]:
    answer = httpx.post(f"{url}/v1/trajectories/{tid}/generate", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    result: dict[str, object] = answer.json()
    return result


def sampling(max_tokens: int, seed: int = 7) -> dict[str, object]:
    return {
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_p": 0.9,
        "seed": seed,
        "ignore_eos": True,
        "logprobs": True,
    }


def test_resident_context_hits_the_prefix_cache_more_each_turn(workers: tuple[str, str]) -> None:
    url, _ = workers
    first = generate(
        url, "multi", {"append_token_ids": list(range(10, 110)), "sampling": sampling(20)}
    )
    assert first["prompt_tokens"] == 100 and first["cached_tokens"] == 0
    assert len(first["token_ids"]) == 20 and first["finish_reason"] == "length"  # type: ignore[arg-type]
    assert len(first["logprobs"]) == 20  # type: ignore[arg-type]
    cached = [0]
    context = 120
    for turn in range(3):
        message = {"role": "tool", "content": f"result {turn}"}
        out = generate(url, "multi", {"messages": [message], "sampling": sampling(20)})
        cached.append(int(out["cached_tokens"]))  # type: ignore[call-overload]
        # What the previous turns left is cached, down to a whole 32-token block.
        assert context // 32 * 32 <= cached[-1] <= context
        context = int(out["context_tokens"])  # type: ignore[call-overload]
    assert cached == sorted(cached) and cached[-1] > cached[1] > 0


def test_a_context_moved_to_another_worker_continues_identically(workers: tuple[str, str]) -> None:
    source, target = workers
    generate(source, "move", {"append_token_ids": list(range(20, 84)), "sampling": sampling(24)})
    context = httpx.get(f"{source}/v1/trajectories/move", timeout=10).json()["token_ids"]
    imported = httpx.put(
        f"{target}/v1/trajectories/move", json={"token_ids": context, "warm": True}, timeout=120
    )
    assert imported.status_code == 200 and imported.json()["context_tokens"] == len(context)
    here = generate(
        source, "move", {"append_token_ids": [5, 6, 7], "sampling": sampling(16, seed=99)}
    )
    there = generate(
        target, "move", {"append_token_ids": [5, 6, 7], "sampling": sampling(16, seed=99)}
    )
    assert here["token_ids"] == there["token_ids"]
    assert int(there["cached_tokens"]) >= 32 * (len(context) // 32)  # type: ignore[call-overload]


def test_priority_orders_steps_waiting_for_the_single_batch_slot(workers: tuple[str, str]) -> None:
    _, url = workers  # max-num-seqs 1: steps run one at a time
    finished: list[str] = []

    def run(tid: str, priority: int, tokens: int) -> None:
        generate(
            url,
            tid,
            {
                "append_token_ids": list(range(30, 60)),
                "sampling": sampling(tokens),
                "priority": priority,
            },
        )
        finished.append(tid)

    with ThreadPoolExecutor(3) as pool:
        blocker = pool.submit(run, "blocker", 0, 400)
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/v1/state", timeout=5).json()["running"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        low = pool.submit(run, "low", 50, 4)
        while httpx.get(f"{url}/v1/state", timeout=5).json()["waiting"] < 1:  # vLLM's own count
            assert time.monotonic() < deadline
            time.sleep(0.01)
        high = pool.submit(run, "high", -50, 4)
        for f in (blocker, low, high):
            f.result()
    assert finished[0] == "blocker"
    assert finished.index("high") < finished.index("low")


def test_a_step_waiting_for_the_batch_slot_reports_its_queue_time(
    workers: tuple[str, str],
) -> None:
    """queue_s is vLLM's own waiting time (it was always 0); the parts add up."""
    _, url = workers  # max-num-seqs 1: the second step waits for the first
    body = {"append_token_ids": list(range(30, 60)), "sampling": sampling(300)}
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(generate, url, "q-first", body)
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/v1/state", timeout=5).json()["running"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        second = pool.submit(generate, url, "q-second", {**body, "sampling": sampling(4)})
        ran, waited = first.result()["timings"], second.result()["timings"]
    assert isinstance(ran, dict) and isinstance(waited, dict)
    # The second waited for most of the first's decoding; the first barely waited.
    assert waited["queue_s"] > 0.3 * ran["decode_s"] > 0
    assert ran["queue_s"] < waited["queue_s"]
    for t in (ran, waited):
        engine = t["queue_s"] + t["prefill_s"] + t["decode_s"]
        assert 0 < engine <= t["total_s"] <= t["handle_s"]


def test_state_reports_the_vllm_engine(workers: tuple[str, str]) -> None:
    url, _ = workers
    state = httpx.get(f"{url}/v1/state", timeout=5).json()
    assert state["engine"] == "vllm" and state["tp"] == 1 and state["ready"]
    assert state["max_model_len"] == 2048


def test_without_max_model_len_the_worker_takes_the_models_own(
    workers: tuple[str, str], tmp_path: Path
) -> None:
    _, url = workers
    own = json.loads((_MODEL_DIRS[0] / "config.json").read_text())["max_position_embeddings"]
    assert httpx.get(f"{url}/v1/state", timeout=5).json()["max_model_len"] == own


def test_a_context_longer_than_the_models_is_one_sentence_and_exit_2(
    workers: tuple[str, str],
) -> None:
    proc = start_worker(_MODEL_DIRS[0], free_port(), max_model_len=1 << 20)
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 2, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("heddle: error: max_model_len 1048576 is more than"), output[-2000:]
    assert "leave it out" in last and "Traceback" not in output


def test_an_overlong_context_is_refused_before_it_reaches_vllm(workers: tuple[str, str]) -> None:
    url, _ = workers
    answer = httpx.post(
        f"{url}/v1/trajectories/long/generate", json={"append_token_ids": [1] * 3000}, timeout=10
    )
    assert answer.status_code == 400 and "max length 2048" in answer.json()["error"]


@pytest.mark.parametrize(("body", "status", "message"), BAD_GENERATE_BODIES)
def test_bad_sampling_gets_the_same_4xx_as_on_the_sim_engine(
    workers: tuple[str, str], body: str, status: int, message: str
) -> None:
    url, _ = workers
    answer = httpx.post(
        f"{url}/v1/trajectories/bad/generate",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]
    assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200  # the engine is unharmed


def test_token_ids_outside_the_vocabulary_get_422_not_503(workers: tuple[str, str]) -> None:
    url, _ = workers
    vocab = httpx.get(f"{url}/v1/state", timeout=5).json()["vocab_size"]
    outside = [
        {"append_token_ids": [5, vocab]},
        {"append_token_ids": [5], "sampling": {"stop_token_ids": [vocab + 7]}},
    ]
    for body in outside:
        answer = httpx.post(f"{url}/v1/trajectories/oov/generate", json=body, timeout=30)
        assert answer.status_code == 422, answer.text
        assert f"outside the model's vocabulary [0, {vocab})" in answer.json()["error"]
    edge = {"append_token_ids": [5, vocab - 1], "sampling": {"max_tokens": 2}}
    assert httpx.post(f"{url}/v1/trajectories/oov/generate", json=edge, timeout=60).is_success
    put = httpx.put(f"{url}/v1/trajectories/oov2", json={"token_ids": [vocab]}, timeout=30)
    assert put.status_code == 422


def test_warm_imports_of_a_full_or_an_empty_context(workers: tuple[str, str]) -> None:
    url, _ = workers
    full = {"token_ids": [7] * 2048, "warm": True}  # exactly --max-model-len
    answer = httpx.put(f"{url}/v1/trajectories/full", json=full, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["context_tokens"] == 2048
    empty = httpx.put(f"{url}/v1/trajectories/empty", json={"token_ids": [], "warm": True})
    assert empty.status_code == 422 and "at least 1 item" in empty.json()["error"]
    assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200


def test_a_step_whose_client_disconnects_is_aborted_in_vllm(workers: tuple[str, str]) -> None:
    url, _ = workers
    body = {"append_token_ids": list(range(30, 60)), "sampling": sampling(1900)}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/trajectories/gone/generate", json=body, timeout=2.0)
    deadline = time.monotonic() + 10
    while httpx.get(f"{url}/v1/state", timeout=5).json()["running"] > 0:
        assert time.monotonic() < deadline, "the step kept running after its client left"
        time.sleep(0.05)
    assert httpx.get(f"{url}/v1/trajectories/gone", timeout=5).status_code == 404
    text = httpx.get(f"{url}/metrics", timeout=5).text
    assert 'route="POST /v1/trajectories/{trajectory_id}/generate",status="499"' in text


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_a_hand_started_worker_runs_vllm_with_heddle_runs_cpu_defaults(
    workers: tuple[str, str],
) -> None:
    """vLLM's engine core (a child process) gets the binding `heddle run` gives its workers."""
    url, _ = workers
    environments = []
    for pid in descendants(_PROCESSES[url].pid):
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        environments.append(dict(v.split("=", 1) for v in raw.decode().split("\0") if "=" in v))
    assert environments, "the vLLM worker has no engine-core process"
    for env in environments:
        assert env.get(THREADS_BIND) == "0" and env.get("HF_HUB_OFFLINE") == "1"


def test_sigterm_aborts_a_long_vllm_step_and_exits(workers: tuple[str, str]) -> None:
    """Runs last of the tests on the shared workers: it stops the second one."""
    _, url = workers
    proc = _PROCESSES[url]
    body = {"append_token_ids": list(range(30, 60)), "sampling": sampling(1900)}
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(
            httpx.post, f"{url}/v1/trajectories/sig/generate", json=body, timeout=120
        )
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/v1/state", timeout=5).json()["running"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        answer = long.result()
    assert answer.status_code == 503
    assert "aborted this step" in answer.json()["error"]
    assert proc.wait(timeout=90) == 0


def test_a_tp2_worker_starts_and_serves(tmp_path: Path) -> None:
    """Reshaping moves trajectories between TP degrees: TP=2 must work (one core per rank)."""
    from heddle.worker._tiny_model import write_tiny_model

    model = write_tiny_model(tmp_path / "model")
    port = free_port()
    proc = start_worker(model, port, "--tp", "2")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url)
        out = generate(
            url, "tp2", {"append_token_ids": list(range(40, 80)), "sampling": sampling(8)}
        )
        assert len(out["token_ids"]) == 8  # type: ignore[arg-type]
        assert httpx.get(f"{url}/v1/state", timeout=5).json()["tp"] == 2
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_tiny_model_is_written_without_downloading(tmp_path: Path) -> None:
    from heddle.worker._tiny_model import write_tiny_model

    path = write_tiny_model(tmp_path / "m")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in path.iterdir()
    }
