"""``heddle bench worker``: what the worker API costs over vLLM's own ``generate``.

One in-process vLLM engine; the same batch of concurrent requests (same
contexts, same lengths, ``ignore_eos``) goes alternately straight to
``AsyncLLM.generate`` and through the worker's HTTP API on a loopback port.
Reports tokens/s of each (median over rounds) and the overhead.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx
import uvicorn

from heddle.worker import VLLMConfig, VLLMEngine, create_app

__all__ = ["bench_worker"]


async def _direct(
    engine: VLLMEngine, concurrency: int, prompt: int, tokens: int, round_: int
) -> float:
    from vllm import SamplingParams  # noqa: PLC0415 - optional extra
    from vllm.inputs import TokensPrompt  # noqa: PLC0415

    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=1.0)

    async def one(i: int) -> int:
        context = [(7 * i + j) % 200 + 10 for j in range(prompt)]
        final: Any = None
        async for out in engine._llm.generate(
            TokensPrompt(prompt_token_ids=context), params, f"direct-{round_}-{i}"
        ):
            final = out
        return len(final.outputs[0].token_ids)

    started = time.perf_counter()
    produced = await asyncio.gather(*(one(i) for i in range(concurrency)))
    return sum(produced) / (time.perf_counter() - started)


async def _through_api(url: str, concurrency: int, prompt: int, tokens: int, round_: int) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one(i: int) -> int:
            context = [(7 * i + j) % 200 + 10 for j in range(prompt)]
            body = {
                "append_token_ids": context,
                "sampling": {"max_tokens": tokens, "ignore_eos": True},
            }
            answer = await client.post(f"/v1/trajectories/api-{round_}-{i}/generate", json=body)
            answer.raise_for_status()
            return len(answer.json()["token_ids"])

        started = time.perf_counter()
        produced = await asyncio.gather(*(one(i) for i in range(concurrency)))
        return sum(produced) / (time.perf_counter() - started)


async def _run(
    model: str, concurrency: int, prompt: int, tokens: int, rounds: int, port: int
) -> dict[str, Any]:
    engine = VLLMEngine(
        VLLMConfig(model=model, max_model_len=4096, max_num_seqs=max(concurrency, 1))
    )
    app = create_app(engine, grace_s=5)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.1)
    url = f"http://127.0.0.1:{port}"
    await _direct(engine, concurrency, prompt, tokens, -1)  # warm-up
    direct, api = [], []
    for r in range(rounds):
        direct.append(await _direct(engine, concurrency, prompt, tokens, r))
        api.append(await _through_api(url, concurrency, prompt, tokens, r))
    server.should_exit = True
    await serving
    d, a = statistics.median(direct), statistics.median(api)
    return {
        "model": model,
        "concurrency": concurrency,
        "prompt_tokens": prompt,
        "max_tokens": tokens,
        "rounds": rounds,
        "direct_tokens_per_s": direct,
        "api_tokens_per_s": api,
        "median_direct_tokens_per_s": d,
        "median_api_tokens_per_s": a,
        "overhead": 1.0 - a / d,
    }


def bench_worker(
    *,
    model: str,
    concurrency: int = 32,
    prompt: int = 128,
    tokens: int = 64,
    rounds: int = 5,
    port: int = 18_555,
) -> dict[str, Any]:
    return asyncio.run(_run(model, concurrency, prompt, tokens, rounds, port))
