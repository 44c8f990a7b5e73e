"""``heddle bench profile``: measure real workers into an engine profile.

Two ``heddle worker --engine vllm`` processes (local subprocesses, TP1:
vLLM's CPU build runs one rank per core here), driven at once because in a
rollout they share the machine's cores, get controlled batches through
their HTTP API; their measurements are pooled:

* decode: ``b`` trajectories of ``L`` context tokens each are prefilled, then
  all append one token and generate ``N`` more together (``ignore_eos``); the
  worker's ``decode_s / (N - 1)`` is one iteration at batch ``b`` with about
  ``b * (L + N/2)`` context tokens. Median over the batch and the repeats.
* prefill: one fresh context of ``n`` tokens, one token generated; the
  worker's time to first token. Median over repeats.
* overhead: what a step costs beyond the engine's own time (HTTP, JSON,
  the worker's chat rendering and bookkeeping, vLLM's API process), from the
  client's clock minus the engine core's (queue + prefill + decode). Measured
  twice: on the controlled batches above (``isolated``), and on a
  rollout-shaped load (``rollout``: as many multi-turn chat trajectories per
  worker as the rollout runs, with tool gaps, for ``rollout_seconds``), whose
  mean is the profile's ``request_overhead_s``: in a rollout the API process
  shares the cores with busy engines and new requests arrive all the time,
  and the step's time outside the engine was 4-20x the isolated figure
  (docs/benchmarks.md, Fidelity). The mean, not the median: a trajectory's
  makespan adds up its steps' overheads, and their tail is long.

The fits (:func:`heddle.scheduler.fit_decode`, :func:`fit_prefill`) and the
raw medians go into one JSON file a cluster YAML names with ``profile:``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import platform
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from heddle.exceptions import ConfigError
from heddle.rollout import LocalPool, LocalWorkerOptions
from heddle.scheduler import PROFILE_FORMAT, DecodeFit, PrefillFit, fit_decode, fit_prefill
from heddle.worker import HttpError, HttpPool, WorkerEndpoint, _json

__all__ = [
    "DEFAULT_BATCHES",
    "DEFAULT_CONTEXTS",
    "DEFAULT_PREFILLS",
    "DEFAULT_ROLLOUT_TRAJECTORIES",
    "ProfileGrid",
    "bench_profile",
    "model_spec_of",
    "profile_grid",
    "rollout_per_worker",
]

DEFAULT_BATCHES = (1, 2, 4, 8)
DEFAULT_CONTEXTS = (64, 1024, 3000)
DEFAULT_PREFILLS = (32, 256, 1024, 2048, 3500)
# The rollout-shaped load's trajectories over all workers: the fidelity workload's 64.
DEFAULT_ROLLOUT_TRAJECTORIES = 64
_DECODE_TOKENS = 64  # per measurement: ~0.5 s of decoding, long against scheduler jitter
_ROLLOUT_TURNS = 3  # per trajectory of the rollout-shaped load (the fidelity workload's median)
_ROLLOUT_PROMPT_WORDS = 100
_ROLLOUT_TOOL_WORDS = 50
_ROLLOUT_OUTPUT_TOKENS = (16, 160)  # per turn, uniform
_ROLLOUT_TOOL_S = (0.1, 0.7)  # tool gap, uniform (the fidelity workload's ~0.4 s)


@dataclass(frozen=True)
class ProfileGrid:
    """Where :func:`bench_profile` times the engine: batch sizes, decode contexts and
    prefill lengths (tokens)."""

    batches: tuple[int, ...] = DEFAULT_BATCHES
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    prefills: tuple[int, ...] = DEFAULT_PREFILLS


def profile_grid(max_num_seqs: int, contexts: str | None, prefills: str | None) -> ProfileGrid:
    """``bench_profile``'s grid from the CLI: batches in powers of two up to the batch cap.

    A real model profiles slower than the tiny one, and far slower on a loaded
    host (SmolLM2's 1,024-token prefill: 0.72 s on a quiet 2-core host, 45 s
    beside other benchmarks), so the contexts and prefills can be cut to what
    the workload reaches; the defaults are the shipped profile's.
    """
    if max_num_seqs < 1:
        raise ConfigError(f"--max-num-seqs {max_num_seqs}: write a whole number from 1, e.g. 8")
    batches = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b < max_num_seqs)
    grid: dict[str, tuple[int, ...]] = {}
    for key, text, default in (
        ("contexts", contexts, DEFAULT_CONTEXTS),
        ("prefills", prefills, DEFAULT_PREFILLS),
    ):
        try:
            values = tuple(int(v) for v in text.split(",")) if text else default
        except ValueError:
            values = ()
        if not values or min(values) < 1:
            raise ConfigError(
                f"--profile-{key} {text!r}: write token counts from 1, comma-separated, "
                f"e.g. {','.join(map(str, default))}"
            )
        grid[key] = tuple(sorted(set(values)))
    return ProfileGrid((*batches, max_num_seqs), grid["contexts"], grid["prefills"])


def rollout_per_worker(trajectories: int | None, workload: int | None, workers: int) -> int:
    """Trajectories per worker of the rollout-shaped load: the rollout's, over the workers.

    The time a step spends outside the engine grows with the trajectories in
    flight, so the load runs as many as the rollout the profile is for:
    ``trajectories`` (``--trajectories``) when given, else the workload's
    (``bench fidelity``), else :data:`DEFAULT_ROLLOUT_TRAJECTORIES`.
    """
    total = trajectories if trajectories is not None else workload or DEFAULT_ROLLOUT_TRAJECTORIES
    if total < 1:
        raise ConfigError(
            f"--trajectories {total}: write the rollout's trajectories, a whole number from 1, "
            f"e.g. {DEFAULT_ROLLOUT_TRAJECTORIES}"
        )
    return -(-total // workers)


_FILLER = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "seven", "wizards")


def model_spec_of(model_dir: str) -> dict[str, Any]:
    """The profile's model section from a Hugging Face ``config.json`` (and the weights' size)."""
    path = Path(model_dir)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path / 'config.json'} cannot be read as JSON ({exc})") from None
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    width = 4 if dtype in ("float32", "float") else 2
    heads = int(config["num_attention_heads"])
    weights = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return {
        "name": path.name,
        "params_billion": weights / width / 1e9,
        "num_layers": int(config["num_hidden_layers"]),
        "hidden_size": int(config["hidden_size"]),
        "num_kv_heads": int(config.get("num_key_value_heads", heads)),
        "head_dim": int(config.get("head_dim") or config["hidden_size"] // heads),
        "bytes_per_param": width,
    }


def _kv_bytes_per_token(model: dict[str, Any]) -> int:
    m = model
    return int(2 * m["num_layers"] * m["num_kv_heads"] * m["head_dim"] * m["bytes_per_param"])


def _engine_s(timings: dict[str, Any]) -> float:
    """The engine core's time of a step: waiting queue, prefill and decode."""
    return float(timings["queue_s"]) + float(timings["prefill_s"]) + float(timings["decode_s"])


class _Driver:
    """Requests to one worker, with token ids drawn from its vocabulary."""

    def __init__(self, client: HttpPool, vocab: int, seed: int, index: int = 0) -> None:
        self.client = client
        self.index = index  # which worker: steps overlap in time only on their own
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.count = 0
        self.overheads: list[float] = []  # client time beyond the engine core's, per request
        # Per step of the rollout-shaped load: where the time outside the engine core went.
        self.rollout_steps: list[dict[str, float]] = []
        self.in_flight = 0  # steps of the rollout-shaped load under way on this worker

    def tokens(self, n: int) -> list[int]:
        # Random ids: no two contexts share a prefix, so nothing comes from the cache.
        return [self.rng.randrange(10, self.vocab) for _ in range(n)]

    async def step(
        self,
        tid: str,
        append: list[int] | None,
        max_tokens: int,
        messages: list[dict[str, str]] | None = None,
        reset: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"sampling": {"max_tokens": max_tokens, "ignore_eos": True}}
        if messages is not None:
            body["messages"] = messages
        else:
            body["append_token_ids"] = append
        if reset:
            body["reset"] = True
        # The session's own HTTP client (it retries a keep-alive connection the server
        # closed): the overhead measured is the one a rollout pays.
        started = time.perf_counter()
        path = f"/v1/trajectories/{tid}/generate"
        status, reply = await self.client.request("POST", path, _json.dumps(body), timeout=600)
        if status != 200:
            raise ConfigError(f"profile step {path}: {status} {reply[:300]!r}")
        answer: dict[str, Any] = _json.loads(reply)
        answer["client_s"] = time.perf_counter() - started
        self.overheads.append(answer["client_s"] - _engine_s(answer["timings"]))
        return answer

    async def trajectory(self, deadline: float) -> None:
        """Multi-turn chat trajectories one after another until ``deadline`` (perf_counter).

        Shaped like the session's steps: chat messages rendered by the worker, a
        tool gap between turns, the context kept resident between them.
        """
        low, high = _ROLLOUT_OUTPUT_TOKENS
        while time.perf_counter() < deadline:
            (tid,) = self.fresh(1)
            messages = [{"role": "user", "content": self.words(_ROLLOUT_PROMPT_WORDS)}]
            for turn in range(_ROLLOUT_TURNS):
                self.in_flight += 1
                sent_with = self.in_flight
                try:
                    reply = await self.step(
                        tid, None, self.rng.randint(low, high), messages=messages, reset=turn == 0
                    )
                finally:
                    self.in_flight -= 1
                t = reply["timings"]
                self.rollout_steps.append(
                    {
                        # What the engine did for the step, against the fits (bench_profile).
                        "worker": float(self.index),
                        "end_s": time.perf_counter(),
                        "in_flight": float(sent_with),
                        "tokens": float(len(reply["token_ids"])),
                        "context_tokens": float(reply["context_tokens"]),
                        "uncached_tokens": float(reply["prompt_tokens"] - reply["cached_tokens"]),
                        "prefill_s": float(t["prefill_s"]),
                        "decode_s": float(t["decode_s"]),
                        "outside_engine_s": reply["client_s"] - _engine_s(t),
                        "http_s": reply["client_s"] - float(t.get("handle_s") or t["total_s"]),
                        "worker_s": float(t.get("handle_s") or t["total_s"]) - t["total_s"],
                        "engine_frontend_s": t["total_s"] - _engine_s(t),
                        "queue_s": float(t["queue_s"]),
                    }
                )
                if turn + 1 < _ROLLOUT_TURNS:
                    await asyncio.sleep(self.rng.uniform(*_ROLLOUT_TOOL_S))
                    messages = [{"role": "tool", "content": self.words(_ROLLOUT_TOOL_WORDS)}]
            await self.drop([tid])

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(_FILLER) for _ in range(n))

    async def drop(self, tids: Sequence[str]) -> None:
        for tid in tids:
            with contextlib.suppress(HttpError):  # it goes when the worker stops
                await self.client.request("DELETE", f"/v1/trajectories/{tid}")

    def fresh(self, n: int) -> list[str]:
        self.count += n
        return [f"prof-{self.count - i}" for i in range(n)]

    async def decode(self, batch: int, context: int) -> float:
        """Seconds per decode iteration at ``batch`` (median over the batch)."""
        tids = self.fresh(batch)
        await asyncio.gather(*(self.step(t, self.tokens(context), 1) for t in tids))
        replies = await asyncio.gather(
            *(self.step(t, self.tokens(1), _DECODE_TOKENS) for t in tids)
        )
        await self.drop(tids)
        per_iteration = [
            float(r["timings"]["decode_s"]) / (len(r["token_ids"]) - 1)
            for r in replies
            if len(r["token_ids"]) > 1
        ]
        return statistics.median(per_iteration)

    async def prefill(self, tokens: int) -> float:
        """The engine's time to first token of one fresh context."""
        (tid,) = self.fresh(1)
        reply = await self.step(tid, self.tokens(tokens), 1)
        await self.drop([tid])
        return float(reply["timings"]["prefill_s"])


async def _measure_one(
    worker: WorkerEndpoint,
    batches: Sequence[int],
    contexts: Sequence[int],
    prefills: Sequence[int],
    repeats: int,
    seed: int,
    progress: Callable[[str], None],
    rollout: _RolloutLoad,
    index: int,
) -> tuple[dict[tuple[int, int], list[float]], dict[int, list[float]], _Driver]:
    """One worker's decode and prefill times per point, and its requests' overheads."""
    url = worker.url
    client = HttpPool(url, rollout.trajectories_per_worker + 8, token=worker.token)
    try:
        _, state_body = await client.request("GET", "/v1/state")
        driver = _Driver(client, int(_json.loads(state_body)["vocab_size"]), seed, index)
        await driver.decode(2, 64)  # warm-up: first requests pay one-off costs
        driver.overheads.clear()
        # Every repeat visits the grid in a fresh order, so load from elsewhere on a
        # shared machine spreads over all points instead of biasing a few.
        grid = [(b, c) for c in contexts for b in batches]
        decode: dict[tuple[int, int], list[float]] = {point: [] for point in grid}
        order = random.Random(seed)
        for r in range(repeats):
            for batch, context in order.sample(grid, len(grid)):
                decode[(batch, context)].append(await driver.decode(batch, context))
            progress(f"{url}: decode grid, repeat {r + 1}/{repeats} done")
        prefill = {n: [await driver.prefill(n) for _ in range(repeats)] for n in prefills}
        isolated = len(driver.overheads)  # the controlled batches' requests end here
        # Every worker starts the rollout-shaped load at once, as they run in a rollout.
        await rollout.barrier.wait()
        deadline = time.perf_counter() + rollout.seconds
        await asyncio.gather(
            *(driver.trajectory(deadline) for _ in range(rollout.trajectories_per_worker))
        )
        del driver.overheads[isolated:]  # those steps are in rollout_steps
        progress(f"{url}: rollout-shaped load, {len(driver.rollout_steps)} steps")
    finally:
        await client.aclose()
    return decode, prefill, driver


async def _measure(
    workers: Sequence[WorkerEndpoint],
    batches: Sequence[int],
    contexts: Sequence[int],
    prefills: Sequence[int],
    repeats: int,
    seed: int,
    progress: Callable[[str], None],
    rollout_trajectories: int,
    rollout_seconds: float,
) -> dict[str, Any]:
    """Every worker measured at once (they share the machine as in a rollout); pooled."""
    load = _RolloutLoad(asyncio.Barrier(len(workers)), rollout_trajectories, rollout_seconds)
    each = await asyncio.gather(
        *(
            _measure_one(worker, batches, contexts, prefills, repeats, seed + i, progress, load, i)
            for i, worker in enumerate(workers)
        )
    )
    decode: list[list[float]] = []
    for batch in batches:
        for context in contexts:
            median = statistics.median(t for d, _, _ in each for t in d[(batch, context)])
            decode.append([batch, batch * (context + 1 + _DECODE_TOKENS / 2), median])
            progress(f"decode batch {batch:3d} x {context:5d} tokens: {median * 1e3:7.2f} ms")
    prefill: list[list[float]] = []
    for n in prefills:
        median = statistics.median(t for _, p, _ in each for t in p[n])
        prefill.append([n, median])
        progress(f"prefill {n:5d} tokens: {median * 1e3:7.2f} ms")
    isolated = [x for _, _, d in each for x in d.overheads]
    steps = [x for _, _, d in each for x in d.rollout_steps]
    return {
        "decode_points": decode,
        "prefill_points": prefill,
        "step_overhead": _overhead_summary(isolated, steps, rollout_trajectories, rollout_seconds),
        "rollout_steps": steps,
    }


def rollout_scales(
    steps: Sequence[dict[str, float]], decode: DecodeFit, prefill: PrefillFit, batch_cap: int
) -> dict[str, float]:
    """How much slower the engine core ran under the rollout-shaped load than the fits say.

    ``decode_scale`` (the simulator uses it): the steps' engine-core decode time
    over what the simulator charges for the same work. That is the fit's
    iterations at the batch that decoded beside the step (the other steps'
    decode windows overlapping its own on that worker, up to the cap; the
    batch's context is this step's times the batch), plus the prefill fit of
    every other step on that worker whose first token came inside the window:
    the simulator stalls a running batch for an admission's prefill, and vLLM's
    chunked prefill puts it into the running batch's iterations, so a ratio
    without it counts that prefill twice. ``first_token_over_prefill_fit``
    (recorded, not used): the steps' time from being scheduled to the first
    token over the fit's prefill of their uncached tokens; on a running engine
    that is a whole mixed iteration, the batch's decode included, so it is no
    prefill cost. Ratios of sums: a makespan adds iterations up. 1.0 when the
    load gave nothing.
    """
    real_decode = fit_decode_total = real_prefill = fit_prefill_total = 0.0
    windows = [_decode_window(s) for s in steps]
    for i, s in enumerate(steps):
        if s["uncached_tokens"] > 0:
            real_prefill += s["prefill_s"]
            fit_prefill_total += prefill.time(int(s["uncached_tokens"]))
        iterations = s["tokens"] - 1
        first, last = windows[i]
        if iterations < 1 or last <= first:
            continue
        beside = stalls = 0.0
        for j, other in enumerate(steps):
            if j == i or other["worker"] != s["worker"]:
                continue
            o_first, o_last = windows[j]
            beside += max(0.0, min(last, o_last) - max(first, o_first))
            if first < o_first <= last and other["uncached_tokens"] > 0:
                stalls += prefill.time(int(other["uncached_tokens"]))
        batch = int(min(batch_cap, max(1.0, round(1.0 + beside / (last - first)))))
        fixed, slope = decode.at(batch)
        context = batch * (s["context_tokens"] - s["tokens"] / 2)
        real_decode += s["decode_s"]
        fit_decode_total += iterations * (fixed + slope * context) + stalls
    return {
        "decode_scale": real_decode / fit_decode_total if fit_decode_total > 0 else 1.0,
        "first_token_over_prefill_fit": (
            real_prefill / fit_prefill_total if fit_prefill_total > 0 else 1.0
        ),
    }


def _decode_window(step: dict[str, float]) -> tuple[float, float]:
    """(first token, last token) of a step on the client's clock: the engine core's
    decode ends before the reply by about half the time spent outside it."""
    last = step["end_s"] - step["outside_engine_s"] / 2
    return last - step["decode_s"], last


def _overhead_summary(
    isolated: Sequence[float],
    steps: Sequence[dict[str, float]],
    trajectories_per_worker: int,
    seconds: float,
) -> dict[str, Any]:
    """The profile's ``step_overhead`` section (docs/performance-model.md)."""
    outside = sorted(s["outside_engine_s"] for s in steps)
    if not outside:
        raise ConfigError("the rollout-shaped load finished no step; raise --rollout-seconds")
    parts = ("http_s", "worker_s", "engine_frontend_s", "queue_s")
    return {
        "isolated_median_s": statistics.median(isolated),
        "rollout_mean_s": statistics.fmean(outside),
        "rollout_median_s": statistics.median(outside),
        "rollout_p90_s": outside[int(0.9 * (len(outside) - 1))],
        # Where it went (means): client to worker and back, the worker's own handling
        # outside the engine call, and vLLM's API process and IPC around the engine core.
        "rollout_parts_mean_s": {k: statistics.fmean(s[k] for s in steps) for k in parts},
        "rollout_steps": len(outside),
        "rollout_trajectories_per_worker": trajectories_per_worker,
        "rollout_seconds": seconds,
    }


@dataclass(frozen=True)
class _RolloutLoad:
    """The rollout-shaped phase: started together on every worker, for ``seconds``."""

    barrier: asyncio.Barrier
    trajectories_per_worker: int
    seconds: float


def bench_profile(
    *,
    model: str,
    max_model_len: int = 4096,
    kv_cache_gib: int = 1,
    batches: Sequence[int] = DEFAULT_BATCHES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    prefills: Sequence[int] = DEFAULT_PREFILLS,
    repeats: int = 3,
    seed: int = 1,
    out: Path,
    name: str = "vllm-cpu-tiny",
    workers: int = 2,
    rollout_trajectories: int = DEFAULT_ROLLOUT_TRAJECTORIES // 2,
    rollout_seconds: float = 20.0,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Profile local vLLM workers (TP1), all at once; return the profile (also in ``out``).

    ``workers`` should be as many as the rollout the profile is for runs: on a
    CPU they share the cores, and a worker measured alone is faster than one
    beside another (docs/benchmarks.md, Fidelity). ``rollout_trajectories``
    per worker run the rollout-shaped load that measures the step's overhead
    (the fidelity workload runs 64 trajectories on 2 workers: 32 each).
    """
    if max(contexts) + _DECODE_TOKENS + 1 > max_model_len or max(prefills) >= max_model_len:
        raise ConfigError(
            f"profile contexts up to {max(*contexts, *prefills)} tokens do not fit "
            f"max_model_len={max_model_len}; lower them or raise --max-model-len"
        )
    options = LocalWorkerOptions(
        engine="vllm",
        model=model,
        max_model_len=max_model_len,
        kv_cache_gib=kv_cache_gib,
        max_num_seqs=max(batches),
        log_dir=out / "logs",
    )
    pool = LocalPool([1] * workers, options)

    async def go() -> dict[str, Any]:
        workers = await pool.start()
        return await _measure(
            workers, batches, contexts, prefills, repeats, seed, progress,
            rollout_trajectories, rollout_seconds,
        )  # fmt: skip

    started = time.perf_counter()
    try:
        measured = asyncio.run(go())
    finally:
        asyncio.run(pool.stop())
    spec = model_spec_of(model)
    decode = fit_decode([(int(b), c, s) for b, c, s in measured["decode_points"]])
    prefill = fit_prefill([(int(n), s) for n, s in measured["prefill_points"]])
    scales = rollout_scales(measured["rollout_steps"], decode, prefill, max(batches))
    residuals = [
        s / (decode.at(int(b))[0] + decode.at(int(b))[1] * c) - 1.0
        for b, c, s in measured["decode_points"]
    ]
    profile = {
        "format": PROFILE_FORMAT,
        "name": name,
        "engine": f"vllm CPU build, {workers} workers at TP1 side by side, enforce_eager",
        "measured": {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {_cores()} cores (shared)",
            "seconds": round(time.perf_counter() - started, 1),
            "repeats": repeats,
            "workers_side_by_side": workers,
            "decode_tokens_per_request": _DECODE_TOKENS,
            "max_num_seqs": max(batches),
            "max_model_len": max_model_len,
            "kv_cache_gib": kv_cache_gib,
            "max_abs_fit_error": max(abs(r) for r in residuals),
        },
        "model": spec,
        # vLLM's CPU build gives the KV cache VLLM_CPU_KVCACHE_SPACE GiB.
        "kv_capacity_tokens": {"1": kv_cache_gib * 2**30 // _kv_bytes_per_token(spec)},
        # What the simulator adds to every step on profiled engines (ARRIVE).
        "request_overhead_s": measured["step_overhead"]["rollout_mean_s"],
        "step_overhead": {
            **measured["step_overhead"],
            "first_token_over_prefill_fit": scales["first_token_over_prefill_fit"],
        },
        # The engine core's decode under the rollout-shaped load against the grid's fit.
        "decode_scale": scales["decode_scale"],
        "decode": {
            "1": {
                "batch_sizes": list(decode.batch_sizes),
                "fixed_s": list(decode.fixed_s),
                "per_context_token_s": list(decode.per_context_token_s),
                "points": measured["decode_points"],
            }
        },
        "prefill": {
            "1": {
                "fixed_s": prefill.fixed_s,
                "per_token_s": prefill.per_token_s,
                "per_token_squared_s": prefill.per_token_squared_s,
                "points": measured["prefill_points"],
            }
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    # The load's steps, so the scales can be recomputed (docs/performance-model.md).
    steps_path = out / f"rollout-steps-{name}.json"
    steps_path.write_text(json.dumps(measured["rollout_steps"]) + "\n", encoding="utf-8")
    path = out / f"profile-{name}.json"
    path.write_text(json.dumps(profile, indent=1) + "\n", encoding="utf-8")
    over = measured["step_overhead"]
    progress(
        f"rollout-shaped load against the fits: decode x{scales['decode_scale']:.2f} "
        f"(first token x{scales['first_token_over_prefill_fit']:.2f} the prefill fit; not used)"
    )
    progress(
        f"step overhead outside the engine: {over['isolated_median_s'] * 1e3:.1f} ms isolated "
        f"(median), {over['rollout_mean_s'] * 1e3:.1f} ms rollout-shaped (mean; median "
        f"{over['rollout_median_s'] * 1e3:.1f} ms, {over['rollout_steps']} steps)"
    )
    progress(
        f"wrote {path}: decode at batch 1 {decode.fixed_s[0] * 1e3:.2f} ms + "
        f"{decode.per_context_token_s[0] * 1e6:.3f} us/context token; largest fit error "
        f"{profile['measured']['max_abs_fit_error']:.1%}"
    )
    return profile


def _cores() -> int:
    import os  # noqa: PLC0415

    return os.cpu_count() or 1
