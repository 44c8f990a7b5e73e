"""`heddle bench gateway`: the gateway's cost per model call, and the calls/s a session serves.

One sim worker whose steps take no modelled time (``time_scale`` 0), so what
is measured is Heddle's own path, never the model:

- *direct*: one trajectory's steps sent straight to the worker API
  (``POST /v1/trajectories/{id}/generate``, a user message appended each time);
- *gateway*: the same steps as an agent makes them, ``POST /v1/chat/completions``
  with the whole conversation, through the gateway, the session's scheduling
  (prediction, priority, placement) and the worker; the per-call overhead is
  the difference of the medians;
- *calls/s*: ``concurrency`` agents, each running episodes of
  :data:`CALLS_PER_EPISODE` calls, until every episode of the job is done.

Agents run in a separate process (plain ``httpx``, not the OpenAI SDK, whose own
client cost is not Heddle's), so they do not share the session's event loop.
Each figure is the median over ``rounds``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from heddle.api import ExternalSpec, SamplingSpec
from heddle.rollout import (
    ExternalEnvironment,
    Gateway,
    LocalPool,
    LocalWorkerOptions,
    OutputSink,
    RolloutSession,
    Task,
)
from heddle.scheduler import HARDWARE_PRESETS, MODEL_PRESETS, PerfModel
from heddle.worker import HttpPool, WorkerClient, WorkerEndpoint

__all__ = ["CALLS_PER_EPISODE", "bench_gateway"]

CALLS_PER_EPISODE = 8
TOKENS_PER_CALL = 16
_TOKEN = "bench"
_MODEL = "bench-model"


async def _direct(worker: WorkerEndpoint, calls: int) -> list[float]:
    """Seconds per step of one trajectory, straight to the worker API."""
    http = HttpPool(worker.url, 4, token=worker.token)
    client = WorkerClient(worker, http)
    sampling = {"max_tokens": TOKENS_PER_CALL, "temperature": 1.0, "ignore_eos": True}
    took = []
    try:
        for i in range(calls):
            started = time.perf_counter()
            await client.generate(
                "direct",
                messages=[{"role": "user", "content": f"step {i}"}],
                sampling=sampling,
                priority=0,
                reset=i == 0,
            )
            took.append(time.perf_counter() - started)
        await client.release("direct")
    finally:
        await http.aclose()
    return took


def _agents(url: str, concurrency: int, calls: int, results: Any) -> None:
    """The agents' process: episodes until none is left; puts (per-call seconds, wall s)."""

    async def one(http: httpx.AsyncClient, took: list[float]) -> None:
        while (ep := (await http.post("episodes")).json())["id"] is not None:
            messages: list[dict[str, Any]] = []
            for i in range(calls):
                messages.append({"role": "user", "content": f"step {i}"})
                body = {"model": _MODEL, "messages": messages, "user": ep["id"]}
                started = time.perf_counter()
                reply = (await http.post("chat/completions", json=body)).json()
                took.append(time.perf_counter() - started)
                messages.append(reply["choices"][0]["message"])
            (await http.post(f"episodes/{ep['id']}/end", json={})).raise_for_status()

    async def main() -> tuple[list[float], float]:
        took: list[float] = []
        limits = httpx.Limits(max_connections=concurrency + 4)
        headers = {"Authorization": f"Bearer {_TOKEN}"}
        async with httpx.AsyncClient(base_url=url + "/", headers=headers, limits=limits,
                                     timeout=120) as http:  # fmt: skip
            started = time.perf_counter()
            await asyncio.gather(*(one(http, took) for _ in range(concurrency)))
            return took, time.perf_counter() - started

    results.put(asyncio.run(main()))


async def _through_gateway(
    workers: list[WorkerEndpoint], tmp: Path, episodes: int, concurrency: int, calls: int
) -> tuple[list[float], float]:
    """(seconds per call, wall seconds) of ``episodes`` episodes of ``calls`` calls."""
    env = ExternalEnvironment(ExternalSpec(), job="bench", model=_MODEL, token=_TOKEN)
    gateway = Gateway(env)
    url = await gateway.start()
    out = tmp / f"gateway-{time.monotonic_ns()}.jsonl"
    session = RolloutSession(
        job="bench",
        tasks=[Task(f"t{i}", ({"role": "user", "content": "x"},)) for i in range(episodes)],
        samples_per_task=1,
        environment=env,
        workers=workers,
        sink=OutputSink(out),
        perf=PerfModel(MODEL_PRESETS["qwen3-8b"], HARDWARE_PRESETS["h100-sxm"]),
        sampling=SamplingSpec(max_tokens_per_turn=TOKENS_PER_CALL, max_total_tokens=1 << 20),
        max_turns=calls + 1,
    )
    run = asyncio.create_task(session.run())
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    agents = spawn.Process(target=_agents, args=(url, concurrency, calls, results), daemon=True)
    agents.start()
    try:
        took, wall = await asyncio.to_thread(results.get, True, 600)
        await run
    finally:
        agents.join(10)
        if agents.is_alive():
            agents.kill()
        if not run.done():
            run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await gateway.stop()
    return took, wall


async def _bench(calls: int, concurrency: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="heddle-bench-gateway-") as folder:
        tmp = Path(folder)
        options = LocalWorkerOptions(engine="sim", time_scale=0.0, log_dir=tmp / "logs",
                                     max_model_len=1 << 20)  # fmt: skip
        pool = LocalPool([1], options)
        try:
            workers = await pool.start()
            await _direct(workers[0], 8)  # warm both paths once
            await _through_gateway(workers, tmp, 1, 1, 4)
            direct, gateway, rate = [], [], []
            for _ in range(rounds):
                direct.append(statistics.median(await _direct(workers[0], calls)))
                took, _ = await _through_gateway(workers, tmp, 1, 1, calls)
                gateway.append(statistics.median(took))
                took, wall = await _through_gateway(
                    workers, tmp, concurrency * 4, concurrency, CALLS_PER_EPISODE
                )
                rate.append(len(took) / wall)
        finally:
            await pool.stop()
    d, g = statistics.median(direct), statistics.median(gateway)
    return {
        "calls": calls,
        "concurrency": concurrency,
        "rounds": rounds,
        "tokens_per_call": TOKENS_PER_CALL,
        "direct_step_ms": [1e3 * x for x in direct],
        "gateway_call_ms": [1e3 * x for x in gateway],
        "calls_per_s": rate,
        "median_direct_step_ms": 1e3 * d,
        "median_gateway_call_ms": 1e3 * g,
        "overhead_per_call_ms": 1e3 * (g - d),
        "median_calls_per_s": statistics.median(rate),
    }


def bench_gateway(*, calls: int = 200, concurrency: int = 32, rounds: int = 3) -> dict[str, Any]:
    """See the module docstring; ``calls`` per latency run, ``concurrency`` agents for calls/s."""
    return asyncio.run(_bench(calls, concurrency, rounds))
