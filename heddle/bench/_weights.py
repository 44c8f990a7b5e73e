"""``heddle bench weights``: a checkpoint swap in place against a worker restart.

A restart is what a pool without in-place loading does between RL steps: the
worker stops (SIGTERM, drain) and starts on the new checkpoint, paying
process start, model load, KV allocation and warm-up. A swap is ``POST
/v1/weights`` on the running worker. Both go through ``heddle worker`` processes
started as ``heddle run`` starts them (:class:`LocalPool`); the checkpoints are
two random-weight tiny models unless ``--model`` names one (then it is
reloaded under new versions: the same bytes to read).

The **stall** is what a load costs the rollout while it runs: a few streams
keep stepping (small steps, as a session does; a refused step is sent again
after 50 ms) and the tokens they get in a window after the load starts are
compared with a window before it; stall = window − tokens ÷ rate before, the
time the engine generated nothing (aborted steps' tokens count as lost). Per
path: ``drain`` (steps in flight finish or are aborted, then the load),
``keep`` (the engine pauses with them inside and resumes them), and the
restart (no token between stop and ready).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

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


_STREAMS = 4  # trajectories stepping at once while a load runs
_STEP_TOKENS = 8  # small steps: a completion every few tenths of a second
_WINDOW_S = 4.0


async def _stall(endpoint: WorkerEndpoint, path: str, version: str, mode: str) -> dict[str, Any]:
    """Tokens the streams get in a window before a load and in one from its start."""
    headers = {"Authorization": f"Bearer {endpoint.token}"} if endpoint.token else {}
    done: list[tuple[float, int]] = []  # (completion time, tokens)
    refused = 0
    stop = asyncio.Event()

    async def stream(http: httpx.AsyncClient, i: int) -> None:
        nonlocal refused
        n = 0
        while not stop.is_set():
            n += 1
            body = {  # a fresh trajectory per step: the context stays short, the prompt cached
                "append_token_ids": [1] * 32,
                "sampling": {"max_tokens": _STEP_TOKENS, "ignore_eos": True},
            }
            reply = await http.post(f"/v1/trajectories/stall-{mode}-{i}-{n}/generate", json=body)
            if reply.status_code == 200:
                done.append((time.perf_counter(), len(reply.json()["token_ids"])))
                await http.delete(f"/v1/trajectories/stall-{mode}-{i}-{n}")
            else:  # refused while loading, or aborted by the drain: as a session, again soon
                refused += 1
                await asyncio.sleep(0.05)

    async with httpx.AsyncClient(base_url=endpoint.url, headers=headers, timeout=600) as http:
        streams = [asyncio.create_task(stream(http, i)) for i in range(_STREAMS)]
        await asyncio.sleep(2.0)  # warm: every stream running
        before = time.perf_counter()
        await asyncio.sleep(_WINDOW_S)
        started = time.perf_counter()
        body = {"path": path, "version": version, "mode": mode}
        answer = (await http.post("/v1/weights", json=body)).json()
        request_s = time.perf_counter() - started
        await asyncio.sleep(max(0.0, started + _WINDOW_S - time.perf_counter()))
        stop.set()
        await asyncio.gather(*streams)
    rate = sum(t for at, t in done if before <= at < started) / _WINDOW_S
    after = sum(t for at, t in done if started <= at < started + _WINDOW_S)
    return {
        "mode": mode,
        "request_s": request_s,
        "load_s": answer.get("load_s"),
        "drained_s": answer.get("drained_s"),
        "kept": answer.get("kept"),
        "tokens_per_s_before": rate,
        "stall_s": max(0.0, _WINDOW_S - after / rate) if rate else None,
        "refused_steps": refused,
    }


async def _run(model: str | None, rounds: int, log_dir: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="heddle-weights-") as tmp:
        if model is None:
            from heddle.worker import write_tiny_model  # noqa: PLC0415

            paths = [str(write_tiny_model(Path(tmp) / f"ckpt-{s}", seed=s)) for s in (0, 1)]
        else:
            paths = [model]
        roots = tuple(sorted({str(Path(p).resolve().parent) for p in paths}))
        options = LocalWorkerOptions(
            engine="vllm", model=paths[0], log_dir=log_dir, weights_roots=roots
        )
        stop_s, start_s, pool = await _restart(options)
        try:
            endpoint = next(iter(pool.procs.values())).endpoint
            swaps = await _swaps(endpoint, paths, rounds)
            stalls = [
                await _stall(endpoint, paths[(k + 1) % len(paths)], f"stall-{k}", mode)
                for k, mode in enumerate(("drain", "keep"))
            ]
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
        # the restart's stall: no worker between the stop and ready
        "stall": [*stalls, {"mode": "restart", "stall_s": stop_s + start_s}],
    }


def bench_weights(
    *, model: str | None = None, rounds: int = 5, log_dir: Path = Path(".heddle/logs")
) -> dict[str, Any]:
    return asyncio.run(_run(model, rounds, log_dir))
