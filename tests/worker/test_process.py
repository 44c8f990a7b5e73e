"""``heddle worker`` as a real process on a loopback port: serving, and SIGTERM drain."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest

pytestmark = pytest.mark.slow  # real processes or engines; `-m 'not slow'` skips them


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def sim_worker(*extra: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A sim-engine worker process in real time (time scale 1), ready to serve."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "heddle",
            "worker",
            "--engine",
            "sim",
            "--port",
            str(port),
            "--time-scale",
            "1",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            pytest.fail("the worker did not become ready within 30 s")
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def worker_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A sim-engine worker with 1 s of drain grace."""
    with sim_worker("--grace", "1") as started:
        yield started


def running(url: str) -> int:
    return int(httpx.get(f"{url}/v1/state", timeout=5).json()["running"])


def wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_sigterm_lets_short_steps_finish_aborts_long_ones_and_exits(
    worker_process: tuple[subprocess.Popen[str], str],
) -> None:
    proc, url = worker_process

    def generate(tid: str, max_tokens: int) -> httpx.Response:
        body = {"append_token_ids": [1] * 64, "sampling": {"max_tokens": max_tokens}}
        return httpx.post(f"{url}/v1/trajectories/{tid}/generate", json=body, timeout=60)

    with ThreadPoolExecutor(2) as pool:
        short = pool.submit(generate, "short", 40)  # ~0.7 s at Qwen3-14B TP1 speed
        long = pool.submit(generate, "long", 20000)  # ~5 min: cannot finish in the grace
        deadline = time.monotonic() + 10
        while not short.done() and time.monotonic() < deadline:  # both admitted?
            if httpx.get(f"{url}/v1/state", timeout=5).json()["running"] >= 2:
                break
            time.sleep(0.02)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        finished = short.result()
        assert finished.status_code == 200, finished.text
        aborted = long.result()
    assert aborted.status_code == 503
    assert "aborted this step" in aborted.json()["error"]
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - sent < 10  # grace of 3 s, plus shutdown


def test_a_served_worker_answers_over_http(
    worker_process: tuple[subprocess.Popen[str], str],
) -> None:
    _, url = worker_process
    answer = httpx.post(
        f"{url}/v1/trajectories/t/generate",
        json={"append_token_ids": [5] * 10, "sampling": {"max_tokens": 4}},
        timeout=30,
    )
    assert answer.status_code == 200 and len(answer.json()["token_ids"]) == 4
    state = httpx.get(f"{url}/v1/state", timeout=5).json()
    assert state["engine"] == "sim" and state["model"] == "Qwen3-14B" and state["tp"] == 1


def long_step(url: str, tid: str, timeout_s: float = 60) -> httpx.Response:
    """A step of 20000 tokens: about 5 min at Qwen3-14B TP1 speed."""
    body = {"append_token_ids": [1] * 64, "sampling": {"max_tokens": 20000}}
    return httpx.post(f"{url}/v1/trajectories/{tid}/generate", json=body, timeout=timeout_s)


def test_a_second_sigterm_aborts_the_steps_and_exits_at_once() -> None:
    with sim_worker("--grace", "60") as (proc, url), ThreadPoolExecutor(1) as pool:
        long = pool.submit(long_step, url, "long")
        wait_for(lambda: running(url) == 1, 10)
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: httpx.get(f"{url}/readyz", timeout=5).status_code == 503, 10)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        aborted = long.result()
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - sent < 5  # not the 60 s grace
    assert aborted.status_code == 503 and "aborted this step" in aborted.json()["error"]


def test_a_step_whose_client_disconnects_stops_generating() -> None:
    with sim_worker("--grace", "1") as (_, url):
        with pytest.raises(httpx.ReadTimeout):
            long_step(url, "gone", timeout_s=1.0)  # the client gives up and closes
        wait_for(lambda: running(url) == 0, 5)
        # The step never finished: its trajectory is as before it (here: not resident).
        assert httpx.get(f"{url}/v1/trajectories/gone", timeout=5).status_code == 404
        text = httpx.get(f"{url}/metrics", timeout=5).text
        assert 'route="POST /v1/trajectories/{trajectory_id}/generate",status="499"' in text


def test_the_body_limit_is_set_with_a_flag() -> None:
    with sim_worker("--max-body-mib", "0.01") as (_, url):
        body = {"messages": [{"role": "user", "content": "x" * 20_000}]}
        answer = httpx.post(f"{url}/v1/trajectories/b/generate", json=body, timeout=10)
        assert answer.status_code == 413
        assert "limit of 10485 bytes" in answer.json()["error"]


def test_a_body_limit_that_is_not_positive_is_refused_in_one_sentence() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "heddle", "worker", "--max-body-mib", "0"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "heddle: error: --max-body-mib 0 must be positive, e.g. 16"


def test_a_taken_port_is_one_sentence_at_once_with_its_own_exit_code() -> None:
    from heddle.exceptions import AddressInUseError

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "heddle", "worker", "--engine", "sim", "--port", str(port)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == AddressInUseError.exit_code
    assert done.stderr == (
        f"heddle: error: cannot listen on 127.0.0.1:{port}: the address is in use; pick "
        "another --port or stop what holds it\n"
    )
