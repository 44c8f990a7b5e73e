"""``heddle bench weights``: a checkpoint swap in place against a worker restart.

A restart is what a pool without in-place loading does between RL steps: the
worker stops (SIGTERM, drain) and starts on the new checkpoint, paying
process start, model load, KV allocation and warm-up. A swap is ``POST
/v1/weights`` on the running worker. Both go through ``heddle worker`` processes
started as ``heddle run`` starts them (:class:`LocalPool`); the checkpoints are
two random-weight tiny models unless ``--model`` names one (then it is
reloaded under new versions: the same bytes to read).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from heddle.exceptions import HeddleError
from heddle.rollout import LocalPool, LocalWorkerOptions
from heddle.worker import HttpPool, WorkerClient, WorkerEndpoint

__all__ = ["bench_weights"]


async def _restart(options: LocalWorkerOptions) -> tuple[float, float, LocalPool]:
    """Seconds to stop a running worker and to start one until ready; the new pool."""
    old = LocalPool([1], options)
    await old.start()
    started = time.perf_counter()
    await old.stop()
    stopped = time.perf_counter()
    new = LocalPool([1], options)
    await new.start()
    return stopped - started, time.perf_counter() - stopped, new


async def _swaps(endpoint: WorkerEndpoint, paths: list[str], rounds: int) -> list[dict[str, float]]:
    http = HttpPool(endpoint.url, 2, token=endpoint.token)
    client = WorkerClient(endpoint, http)
    results = []
    try:
        for r in range(rounds):
            path = paths[(r + 1) % len(paths)]
            started = time.perf_counter()
            await client.load_weights(path, f"bench-{r}", timeout=600)
            wall = time.perf_counter() - started
            if (await client.state())["weight_version"] != f"bench-{r}":
                raise HeddleError(f"the worker does not report version bench-{r} after loading")
            results.append({"wall_s": wall})
    finally:
        await http.aclose()
    return results


async def _run(model: str | None, rounds: int, log_dir: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="heddle-weights-") as tmp:
        if model is None:
            from heddle.worker import write_tiny_model  # noqa: PLC0415

            paths = [str(write_tiny_model(Path(tmp) / f"ckpt-{s}", seed=s)) for s in (0, 1)]
        else:
            paths = [model]
        options = LocalWorkerOptions(engine="vllm", model=paths[0], log_dir=log_dir)
        stop_s, start_s, pool = await _restart(options)
        try:
            endpoint = next(iter(pool.procs.values())).endpoint
            swaps = await _swaps(endpoint, paths, rounds)
        finally:
            await pool.stop()
    swap_s = statistics.median(s["wall_s"] for s in swaps)
    return {
        "model": model or "tiny (two random-weight checkpoints)",
        "rounds": rounds,
        "restart_stop_s": stop_s,
        "restart_start_s": start_s,
        "restart_s": stop_s + start_s,
        "swap_s": [s["wall_s"] for s in swaps],
        "median_swap_s": swap_s,
        "speedup": (stop_s + start_s) / swap_s,
    }


def bench_weights(
    *, model: str | None = None, rounds: int = 5, log_dir: Path = Path(".heddle/logs")
) -> dict[str, Any]:
    return asyncio.run(_run(model, rounds, log_dir))
