"""`heddle run`'s local pool starting its workers: a port lost before the worker binds it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.rollout import LocalPool, LocalWorkerOptions

pytestmark = pytest.mark.slow  # real worker processes


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _PortTakenFirst(LocalPool):
    """Stands in for another process on the host taking a worker's port between the pool
    picking it and the worker binding it: the first port picked is one held by the test."""

    def __init__(self, held: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: int | None = held
        self.chosen: list[int] = []

    def _pick_port(self) -> int:
        port, self.held = (
            (self.held, None) if self.held is not None else (super()._pick_port(), None)
        )
        self.chosen.append(port)
        return port


@pytest.mark.anyio
async def test_a_worker_whose_port_was_taken_starts_again_on_another(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        held = holder.getsockname()[1]
        pool = _PortTakenFirst(held, [1], LocalWorkerOptions(engine="sim", log_dir=tmp_path))
        try:
            endpoints = await pool.start()
            async with httpx.AsyncClient() as http:
                ready = await http.get(endpoints[0].url + "/readyz", timeout=5)
        finally:
            await pool.stop()
    assert pool.chosen[0] == held and len(pool.chosen) == 2
    assert endpoints[0].url == f"http://127.0.0.1:{pool.chosen[1]}"
    assert ready.status_code == 200
    log = (tmp_path / "worker-0-tp1.log").read_text(encoding="utf-8")
    assert f"cannot listen on 127.0.0.1:{held}: the address is in use" in log


_RESTART_THEN_WAIT = """
import asyncio, sys
from pathlib import Path
from heddle.rollout import LocalPool, LocalWorkerOptions

async def main() -> None:
    pool = LocalPool([1], LocalWorkerOptions(engine="sim", log_dir=Path(sys.argv[1])))
    await pool.start()
    name = next(iter(pool.procs))
    pool.kill(name)
    await pool.restart(name)
    print(pool.procs[name].process.pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def _alive(pid: int) -> bool:
    """Running, not a zombie left for a reaper."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_restarted_worker_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    # `heddle run` killed (even by SIGKILL) must not leave a worker it restarted behind.
    parent = subprocess.Popen(
        [sys.executable, "-c", _RESTART_THEN_WAIT, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        assert _alive(worker)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 20
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(worker):
        os.kill(worker, signal.SIGKILL)
        pytest.fail(f"the restarted worker {worker} outlived the process that started it")
