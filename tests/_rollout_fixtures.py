"""Rollout fixtures: real worker processes, a real HTTP tool server, record checks.

The root ``tests/conftest.py`` registers the fixtures for every test package.

Nothing here patches a client: sessions talk HTTP to ``heddle worker``
processes (the simulated engine unless a test asks for vLLM) and to a tool
server on a loopback port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.rollout import LocalPool, LocalWorkerOptions
from heddle.worker import WorkerEndpoint


@dataclass
class ToolServer:
    """A tool server with one behaviour per path; it records every call it gets."""

    url: str
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    flaky_failures: int = 2  # /flaky answers 500 this many times per trajectory first
    sent: dict[str, int] = field(default_factory=dict)  # body bytes written, by path


def _handler(server: ToolServer) -> type[BaseHTTPRequestHandler]:
    failures: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            with lock:
                server.calls.append((self.path, body))
            if self.path == "/ok":
                args = json.dumps(body["arguments"], sort_keys=True)
                reply = {"content": f"{body['name']} says {args}"}
                self._send(200, json.dumps(reply).encode())
            elif self.path == "/garbage":
                self._send(200, b"<html>not json</html>", "text/html")
            elif self.path == "/slow":
                time.sleep(1.0)
                self._send(200, b'{"content": "too late"}')
            elif self.path == "/refuse":
                self._send(400, b'{"error": "argument x must be a number"}')
            elif self.path == "/trickle":  # a valid reply, one byte every 0.5 s
                reply = b'{"content": "drip"}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                for i in range(len(reply)):
                    self.wfile.write(reply[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.5)
            elif self.path in ("/huge", "/huge-unsized"):  # a valid 20 MB reply
                self._huge(sized=self.path == "/huge")
            elif self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "/ok")
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path == "/reset":  # read the call, then drop the connection with a RST
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()
            elif self.path == "/flaky":
                key = body["trajectory_id"]
                with lock:
                    failures[key] = failures.get(key, 0) + 1
                    failing = failures[key] <= server.flaky_failures
                if failing:
                    self._send(500, b'{"error": "temporary"}')
                else:
                    self._send(200, b'{"content": "flaky ok"}')
            else:
                self._send(404, b'{"error": "no such tool"}')

        def _huge(self, *, sized: bool) -> None:
            size = 20 * 1024 * 1024
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if sized:
                self.send_header("Content-Length", str(size + 15))
            self.end_headers()
            block = b"x" * 65536
            try:
                self.wfile.write(b'{"content": "')
                for _ in range(size // len(block)):
                    self.wfile.write(block)
                    with lock:
                        server.sent[self.path] = server.sent.get(self.path, 0) + len(block)
                self.wfile.write(b'"}')
            except OSError:  # the client hung up: what the cap should do
                pass
            self.close_connection = True

    return Handler


@pytest.fixture
def tool_server() -> Iterator[ToolServer]:
    """A real HTTP tool server on a loopback port (paths: see ``_handler``)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    server = ToolServer(f"http://127.0.0.1:{httpd.server_address[1]}")
    httpd.RequestHandlerClass = _handler(server)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()


def start_pool(tps: list[int], tmp: Path, **options: Any) -> tuple[LocalPool, list[WorkerEndpoint]]:
    opts: dict[str, Any] = {"engine": "sim", "time_scale": 0.02, "log_dir": tmp / "logs"}
    opts.update(grace_s=1.0, max_model_len=65_536)  # the sim engine's tokens are bytes
    opts["weights_roots"] = (str(tmp),)  # tests write their checkpoints under tmp
    opts.update(options)
    pool = LocalPool(tps, LocalWorkerOptions(**opts))
    try:
        workers = asyncio.run(pool.start())
    except BaseException:
        asyncio.run(pool.stop())
        raise
    return pool, workers


class SharedPool:
    """One pool of sim workers reused by the tests of a pytest process, started on first use.

    Starting two worker processes costs seconds; most tests only send steps through them.
    After each test :meth:`release` checks that the workers are as a fresh pool's would be
    (alive, ready, nothing running, waiting or resident, start-up weights); a test that
    killed, reloaded or left anything on a worker gets its pool stopped, and the next test
    a fresh one, so no test sees another's workers in a changed state.
    """

    def __init__(self, root: Path, **options: Any) -> None:
        self.root = root
        self.options = options
        self.current: tuple[LocalPool, list[WorkerEndpoint]] | None = None
        self.starts = 0

    def acquire(self) -> tuple[LocalPool, list[WorkerEndpoint]]:
        if self.current is None:
            self.starts += 1
            logs = self.root / f"pool-{self.starts}"
            # Tests write their checkpoints under their own tmp_path: all below the base temp.
            self.current = start_pool([1, 1], logs, **self.options)
        pool, workers = self.current
        return pool, list(workers)

    def release(self) -> None:
        if self.current is not None and not _pristine(*self.current):
            self.close()

    def close(self) -> None:
        if self.current is not None:
            pool, self.current = self.current[0], None
            asyncio.run(pool.stop())


def _pristine(pool: LocalPool, workers: list[WorkerEndpoint], settle_s: float = 5.0) -> bool:
    """Whether every worker is alive and holds nothing a test left (steps may still drain)."""
    if any(proc.process.poll() is not None for proc in pool.procs.values()):
        return False
    headers = {"Authorization": f"Bearer {pool.token}"}
    deadline = time.monotonic() + settle_s
    for worker in workers:
        while True:
            try:
                state = httpx.get(f"{worker.url}/v1/state", headers=headers, timeout=2.0).json()
            except httpx.HTTPError:
                return False
            if state["running"] == 0 and state["waiting"] == 0:
                break
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        if state["resident_trajectories"] or state["weight_version"] is not None:
            return False
        if not state["ready"] or state["draining"]:
            return False
    return True


@pytest.fixture(scope="session")
def _shared_sim_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedPool]:
    shared = SharedPool(
        tmp_path_factory.mktemp("sim-pool"),
        weights_roots=(str(tmp_path_factory.getbasetemp()),),
    )
    yield shared
    shared.close()


@pytest.fixture(scope="session")
def _shared_scripted_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedPool]:
    shared = SharedPool(
        tmp_path_factory.mktemp("scripted-pool"),
        weights_roots=(str(tmp_path_factory.getbasetemp()),),
        scripted_replies=True,
    )
    yield shared
    shared.close()


@pytest.fixture
def sim_pool(_shared_sim_pool: SharedPool) -> Iterator[tuple[LocalPool, list[WorkerEndpoint]]]:
    """Two real ``heddle worker --engine sim`` processes (performance model at 1/50 time),
    shared between tests while they come back pristine (see :class:`SharedPool`)."""
    yield _shared_sim_pool.acquire()
    _shared_sim_pool.release()


@pytest.fixture
def scripted_pool(
    _shared_scripted_pool: SharedPool,
) -> Iterator[tuple[LocalPool, list[WorkerEndpoint]]]:
    """Two sim workers that answer each turn with the prompt's next ``<reply>`` block
    (shared like ``sim_pool``)."""
    yield _shared_scripted_pool.acquire()
    _shared_scripted_pool.release()


def read_records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.split("\n") if line]  # JSONL ends lines at "\n" only


def assert_exactly_once(records: list[dict[str, Any]], expected: set[tuple[str, int]]) -> None:
    keys = [(r["task_id"], r["sample"]) for r in records]
    assert len(keys) == len(set(keys)), "a trajectory was written twice"
    assert set(keys) == expected, f"missing {sorted(expected - set(keys))[:5]}"


def assert_consistent(record: dict[str, Any]) -> None:
    """Token ids, mask and counts agree with each other."""
    response, mask = record["response_token_ids"], record["response_mask"]
    assert len(response) == len(mask)
    assert set(mask) <= {0, 1}
    assert sum(mask) == record["tokens"]["generated"]
    assert len(record["prompt_token_ids"]) == record["tokens"]["prompt"] > 0
    assert len(record["placement"]["steps"]) == record["turns"]
    assistant = [m for m in record["messages"] if m["role"] == "assistant"]
    assert len(assistant) == record["turns"]
    trace = record["trace"]  # what `heddle bench` replays: the same counts, per turn
    assert len(trace["turn_tokens"]) == record["turns"]
    assert sum(trace["turn_tokens"]) == record["tokens"]["generated"]
    assert sum(trace["tool_output_tokens"]) == record["tokens"]["tool"]
    assert len(trace["tool_output_tokens"]) == max(0, record["turns"] - 1)
    assert len(trace["tool_latency_s"]) >= len(trace["tool_output_tokens"])
