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
  the worker's bookkeeping), from the client's clock.

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from heddle.exceptions import ConfigError
from heddle.rollout import LocalPool, LocalWorkerOptions
from heddle.scheduler import PROFILE_FORMAT, fit_decode, fit_prefill
from heddle.worker import WorkerEndpoint

__all__ = ["DEFAULT_BATCHES", "DEFAULT_CONTEXTS", "bench_profile", "model_spec_of"]

DEFAULT_BATCHES = (1, 2, 4, 8)
DEFAULT_CONTEXTS = (64, 1024, 3000)
DEFAULT_PREFILLS = (32, 256, 1024, 2048, 3500)
_DECODE_TOKENS = 64  # per measurement: ~0.5 s of decoding, long against scheduler jitter


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


class _Driver:
    """Requests to one worker, with token ids drawn from its vocabulary."""

    def __init__(self, client: httpx.AsyncClient, vocab: int, seed: int) -> None:
        self.client = client
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.count = 0
        self.overheads: list[float] = []  # client time beyond the worker's own, per request

    def tokens(self, n: int) -> list[int]:
        # Random ids: no two contexts share a prefix, so nothing comes from the cache.
        return [self.rng.randrange(10, self.vocab) for _ in range(n)]

    async def step(self, tid: str, append: list[int], max_tokens: int) -> dict[str, Any]:
        body = {
            "append_token_ids": append,
            "sampling": {"max_tokens": max_tokens, "ignore_eos": True},
        }
        started = time.perf_counter()
        try:
            reply = await self.client.post(f"/v1/trajectories/{tid}/generate", json=body)
        except httpx.TransportError:
            # A keep-alive connection the server closed just as it was reused (seen once in
            # ~2,000 requests): send it again on a fresh one. The timings are the worker's.
            started = time.perf_counter()
            reply = await self.client.post(f"/v1/trajectories/{tid}/generate", json=body)
        reply.raise_for_status()
        answer: dict[str, Any] = reply.json()
        answer["client_s"] = time.perf_counter() - started
        self.overheads.append(answer["client_s"] - answer["timings"]["total_s"])
        return answer

    async def drop(self, tids: Sequence[str]) -> None:
        for tid in tids:
            with contextlib.suppress(httpx.TransportError):  # it goes when the worker stops
                await self.client.delete(f"/v1/trajectories/{tid}")

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
) -> tuple[dict[tuple[int, int], list[float]], dict[int, list[float]], list[float]]:
    """One worker's decode and prefill times per point, and its requests' overheads."""
    url = worker.url
    headers = {} if worker.token is None else {"Authorization": f"Bearer {worker.token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as client:
        state = (await client.get("/v1/state")).json()
        driver = _Driver(client, int(state["vocab_size"]), seed)
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
    return decode, prefill, driver.overheads


async def _measure(
    workers: Sequence[WorkerEndpoint],
    batches: Sequence[int],
    contexts: Sequence[int],
    prefills: Sequence[int],
    repeats: int,
    seed: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Every worker measured at once (they share the machine as in a rollout); pooled."""
    each = await asyncio.gather(
        *(
            _measure_one(worker, batches, contexts, prefills, repeats, seed + i, progress)
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
    overheads = [x for _, _, o in each for x in o]
    return {
        "decode_points": decode,
        "prefill_points": prefill,
        "request_overhead_s": statistics.median(overheads),
    }


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
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Profile local vLLM workers (TP1), all at once; return the profile (also in ``out``).

    ``workers`` should be as many as the rollout the profile is for runs: on a
    CPU they share the cores, and a worker measured alone is faster than one
    beside another (docs/benchmarks.md, Fidelity).
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
        return await _measure(workers, batches, contexts, prefills, repeats, seed, progress)

    started = time.perf_counter()
    try:
        measured = asyncio.run(go())
    finally:
        asyncio.run(pool.stop())
    spec = model_spec_of(model)
    decode = fit_decode([(int(b), c, s) for b, c, s in measured["decode_points"]])
    prefill = fit_prefill([(int(n), s) for n, s in measured["prefill_points"]])
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
        "request_overhead_s": measured["request_overhead_s"],
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
    path = out / f"profile-{name}.json"
    path.write_text(json.dumps(profile, indent=1) + "\n", encoding="utf-8")
    progress(
        f"wrote {path}: decode at batch 1 {decode.fixed_s[0] * 1e3:.2f} ms + "
        f"{decode.per_context_token_s[0] * 1e6:.3f} us/context token; largest fit error "
        f"{profile['measured']['max_abs_fit_error']:.1%}"
    )
    return profile


def _cores() -> int:
    import os  # noqa: PLC0415

    return os.cpu_count() or 1
