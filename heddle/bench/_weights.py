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
after 50 ms); the tokens they get from the load's start until a window after
its end are compared with a window before it: stall = that span − tokens ÷ the
rate before, the time the engine generated nothing (aborted steps' tokens count
as lost). Per path, ``rounds`` times each, medians reported: ``drain`` (steps in
flight finish or are aborted, then the disk reload), ``keep`` (the engine pauses
with them inside, reloads from disk, resumes them), ``push`` (every tensor over
gloo from this process, streamed into the paused engine), ``delta`` (the last
decoder layer's tensors over gloo, received while the engine generates, then a
pause for the load), and the restart (no token between stop and ready).
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
_WINDOW_S = 4.0  # before the load, and after it has ended
PATHS = ("drain", "keep", "push", "delta")  # in-place paths, besides the restart


def _delta_names(names: list[str]) -> list[str]:
    """The delta the bench pushes: the last decoder layer's tensors (a run that trains a
    few layers, or a small change), about 1/L of the model."""
    layers = [n for n in names if ".layers." in n]
    if not layers:
        return names[:1]
    last = max(int(n.split(".layers.")[1].split(".")[0]) for n in layers)
    return [n for n in layers if n.split(".layers.")[1].split(".")[0] == str(last)]


async def _act(
    http: httpx.AsyncClient, endpoint: WorkerEndpoint, path: str, version: str, mode: str,
    state: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """Run one load by ``mode``; what it reports."""
    if mode in ("drain", "keep"):
        body = {"path": path, "version": version, "mode": mode}
        answer = (await http.post("/v1/weights", json=body)).json()
        return {k: answer.get(k) for k in ("load_s", "drained_s", "kept")}
    from heddle.worker import push_weights  # noqa: PLC0415

    changed = _delta_names(list(state)) if mode == "delta" else None
    [answer] = await push_weights([endpoint], state, version, changed=changed, timeout_s=300)
    return {
        "load_s": answer["stall_s"],
        "kept": answer["kept"],
        "pushed_mib": answer["bytes"] / 2**20,
        "receive_s": answer["receive_s"],
        "tensors": answer["tensors"],
    }


async def _stall(
    endpoint: WorkerEndpoint, path: str, version: str, mode: str, state: dict[str, Any]
) -> dict[str, Any]:
    """Tokens the streams get in a window before a load and from its start until a window
    after its end: stall = that span - tokens / the rate before (time no token came)."""
    headers = {"Authorization": f"Bearer {endpoint.token}"} if endpoint.token else {}
    done: list[tuple[float, int]] = []  # (completion time, tokens)
    refused = 0
    stop = asyncio.Event()

    async def stream(http: httpx.AsyncClient, i: int) -> None:
        nonlocal refused
        n = 0
        while not stop.is_set():
            n += 1
            tid = f"stall-{version}-{i}-{n}"
            body = {  # a fresh trajectory per step: the context stays short, the prompt cached
                "append_token_ids": [1] * 32,
                "sampling": {"max_tokens": _STEP_TOKENS, "ignore_eos": True},
            }
            reply = await http.post(f"/v1/trajectories/{tid}/generate", json=body)
            if reply.status_code == 200:
                done.append((time.perf_counter(), len(reply.json()["token_ids"])))
                await http.delete(f"/v1/trajectories/{tid}")
            else:  # refused while loading, or aborted by the drain: as a session, again soon
                refused += 1
                await asyncio.sleep(0.05)

    async with httpx.AsyncClient(base_url=endpoint.url, headers=headers, timeout=600) as http:
        streams = [asyncio.create_task(stream(http, i)) for i in range(_STREAMS)]
        await asyncio.sleep(2.0)  # warm: every stream running
        before = time.perf_counter()
        await asyncio.sleep(_WINDOW_S)
        started = time.perf_counter()
        info = await _act(http, endpoint, path, version, mode, state)
        ended = time.perf_counter()
        # The window after runs from the load's start to _WINDOW_S after its end, so the
        # steps it paused (keep) or refused finish inside it, however long the load took.
        await asyncio.sleep(max(0.0, ended + _WINDOW_S - time.perf_counter()))
        stop.set()
        await asyncio.gather(*streams)
    span = ended + _WINDOW_S - started
    rate = sum(t for at, t in done if before <= at < started) / _WINDOW_S
    after = sum(t for at, t in done if started <= at < started + span)
    return {
        "mode": mode,
        "request_s": ended - started,
        **info,
        "tokens_per_s_before": rate,
        "stall_s": max(0.0, span - after / rate) if rate else None,
        "refused_steps": refused,
    }


def _load_state(path: str) -> dict[str, Any]:
    from safetensors.torch import load_file  # noqa: PLC0415

    state: dict[str, Any] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        state.update(load_file(str(file)))
    return state


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


async def _run(
    model: str | None, rounds: int, log_dir: Path, restart_rounds: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="heddle-weights-") as tmp:
        if model is None:
            from heddle.worker import write_tiny_model  # noqa: PLC0415

            paths = [str(write_tiny_model(Path(tmp) / f"ckpt-{s}", seed=s)) for s in (0, 1)]
        else:
            paths = [model]
        states = [_load_state(p) for p in paths]
        roots = tuple(sorted({str(Path(p).resolve().parent) for p in paths}))
        options = LocalWorkerOptions(
            engine="vllm", model=paths[0], log_dir=log_dir, weights_roots=roots
        )
        restarts = []
        for _ in range(restart_rounds - 1):
            stop_s, start_s, pool = await _restart(options)
            restarts.append((stop_s, start_s))
            await pool.stop()
        stop_s, start_s, pool = await _restart(options)
        restarts.append((stop_s, start_s))
        try:
            endpoint = next(iter(pool.procs.values())).endpoint
            swaps = await _swaps(endpoint, paths, rounds)
            stalls = []
            for r in range(rounds):
                for k, mode in enumerate(PATHS):
                    other = (r * len(PATHS) + k + 1) % len(paths)
                    version = f"{mode}-{r}"
                    stalls.append(
                        await _stall(endpoint, paths[other], version, mode, states[other])
                    )
        finally:
            await pool.stop()
    swap_s = statistics.median(s["wall_s"] for s in swaps)
    restart_s = statistics.median(a + b for a, b in restarts)
    table = []
    for mode in PATHS:
        rows = [s for s in stalls if s["mode"] == mode]
        table.append(
            {
                "mode": mode,
                "stall_s": _median([r["stall_s"] for r in rows]),
                "stalls_s": [r["stall_s"] for r in rows],
                "load_s": _median([r["load_s"] for r in rows]),
                "request_s": _median([r["request_s"] for r in rows]),
                "kept": _median([r["kept"] for r in rows]),
                "refused_steps": _median([r["refused_steps"] for r in rows]),
                "tokens_per_s_before": _median([r["tokens_per_s_before"] for r in rows]),
                "pushed_mib": _median([r.get("pushed_mib") for r in rows]),
            }
        )
    table.append(
        {"mode": "restart", "stall_s": restart_s, "stalls_s": [a + b for a, b in restarts]}
    )
    return {
        "model": model or "tiny (two random-weight checkpoints)",
        "rounds": rounds,
        "restart_rounds": restart_rounds,
        "load": {"streams": _STREAMS, "step_tokens": _STEP_TOKENS, "window_s": _WINDOW_S},
        "restart_stop_s": statistics.median(a for a, _ in restarts),
        "restart_start_s": statistics.median(b for _, b in restarts),
        "restart_s": restart_s,
        "swap_s": [s["wall_s"] for s in swaps],
        "median_swap_s": swap_s,
        "speedup": restart_s / swap_s,
        "stall": table,
        "stall_runs": stalls,
    }


def bench_weights(
    *,
    model: str | None = None,
    rounds: int = 3,
    restart_rounds: int | None = None,
    log_dir: Path = Path(".heddle/logs"),
) -> dict[str, Any]:
    """Restart, swap and the stall per path (drain, keep, push, delta), ``rounds`` each;
    the restart ``restart_rounds`` times (default ``rounds``: each costs a worker start)."""
    return asyncio.run(_run(model, rounds, log_dir, restart_rounds or rounds))
