"""Speculation on real vLLM workers (CPU build, SmolLM2): the output is exact, and counted.

Exactness, as issue 26 asks: at T=0 speculation on and off give the same tokens
(ngram with K fixed, suffix with K by batch size); at T=1 the same statistics: the
mean logprob of the sampled tokens under the model over N samples, on against off.
On this CPU build the T=1 check fails without Heddle's fix (run by hand with
``HEDDLE_VLLM_PATCHES=0``, docs/speculation.md): draft positions then sample with
uninitialised temperatures and the text turns to garbage.

Each fixture starts one worker, collects what its tests assert on, and stops it, so
one engine runs at a time.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.worker import HttpPool, WorkerClient, WorkerEndpoint, ensure_smollm2

from .._vllm import require_vllm
from ..rollout.test_record import _run
from .test_process import free_port
from .test_vllm import start_worker, wait_ready

pytestmark = pytest.mark.slow

# The three-worker comparison is opt-in: on 2 CPU cores the batch of 96 T=1 samples under
# suffix speculation did not finish within 5 minutes (2026-11-26, idle machine), so the
# module ran past 15 minutes and cannot sit in CI's budget as written. The in-process fault
# test below runs everywhere. Run the rest with HEDDLE_SPECULATION_ENGINES=1.
engines = pytest.mark.skipif(
    os.environ.get("HEDDLE_SPECULATION_ENGINES") != "1",
    reason="three SmolLM2 workers: set HEDDLE_SPECULATION_ENGINES=1 (see docs/speculation.md)",
)

require_vllm()

# Text that n-grams and suffix trees can draft from.
MESSAGES = [
    {
        "role": "user",
        "content": "Repeat this list three times: apples, pears, plums, cherries, grapes, "
        "lemons, limes, melons.",
    }
]
SAMPLES = 96  # T=1 samples on each side, one batch
SAMPLE_TOKENS = 48
GREEDY_TOKENS = 64
# Mean logprob per sampled token, on against off. One sample's mean (48 tokens) had a
# standard deviation of about 1.0 here, so the difference of two 96-sample means has a
# standard error of about 0.15: the tolerance is 4 of them. Unfixed (HEDDLE_VLLM_PATCHES=0),
# 24 samples moved it by 1.19 (fixed: 0.41).
LOGPROB_TOLERANCE = 0.6


def _step(temperature: float, max_tokens: int, seed: int | None) -> dict[str, Any]:
    return {
        "messages": MESSAGES,
        "sampling": {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": seed,
            "logprobs": True,
            "ignore_eos": True,
        },
    }


async def _steps(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:

        async def one(name: str, body: dict[str, Any]) -> dict[str, Any]:
            reply = await http.post(f"/v1/trajectories/{name}/generate", json=body)
            assert reply.status_code == 200, reply.text
            data: dict[str, Any] = reply.json()
            return data

        greedy = await one("greedy", _step(0.0, GREEDY_TOKENS, None))
        samples = await asyncio.gather(
            *(one(f"s{i}", _step(1.0, SAMPLE_TOKENS, None)) for i in range(SAMPLES))
        )
        # The record: a trajectory's steps through the session's client and record.
        http_pool = HttpPool(url)
        client = WorkerClient(WorkerEndpoint("w", url), http_pool)
        run = _run()
        reply = await client.generate(
            "rec",
            messages=MESSAGES,
            sampling={"max_tokens": SAMPLE_TOKENS, "temperature": 0.0, "ignore_eos": True},
            priority=0,
        )
        run.apply("w", reply, want_logprobs=False)
        await http_pool.aclose()
        state = (await http.get("/v1/state")).json()
        metrics = (await http.get("/metrics")).text
    record = run.record(policy="heddle", want_logprobs=False)
    return {
        "greedy": greedy,
        "samples": list(samples),
        "state": state,
        "metrics": metrics,
        "record": record,
    }


def _collect(model: Path, *flags: str) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_worker(model, port, *flags, "--max-num-seqs", "96", max_model_len=1024)
    try:
        wait_ready(proc, url, timeout_s=600)
        return asyncio.run(_steps(url))
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return ensure_smollm2(install=False)


@pytest.fixture(scope="module")
def off(smollm2: Path) -> dict[str, Any]:
    return _collect(smollm2)


@pytest.fixture(scope="module")
def ngram(smollm2: Path, off: dict[str, Any]) -> dict[str, Any]:
    return _collect(smollm2, "--speculation", "ngram", "--num-speculative-tokens", "4")


@pytest.fixture(scope="module")
def suffix(smollm2: Path, ngram: dict[str, Any]) -> dict[str, Any]:
    # K by batch size: the single greedy step drafts 5, the batch of 96 drafts 2.
    return _collect(
        smollm2, "--speculation", "suffix", "--speculative-tokens-by-batch-size", "1-4:5,5-128:2"
    )


def _mean_logprob(result: dict[str, Any]) -> float:
    return statistics.fmean(x for s in result["samples"] for x in s["logprobs"])


@pytest.mark.parametrize("method", ["ngram", "suffix"])
@engines
def test_greedy_tokens_are_the_same_with_speculation_on_and_off(
    method: str, off: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    on = request.getfixturevalue(method)
    assert on["greedy"]["token_ids"] == off["greedy"]["token_ids"]
    assert on["greedy"]["speculation"]["accepted_tokens"] > 0  # it did draft, and it held


@pytest.mark.parametrize("method", ["ngram", "suffix"])
@engines
def test_sampling_at_t1_has_the_same_statistics_with_speculation_on_and_off(
    method: str, off: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    on = request.getfixturevalue(method)
    drafted = sum(s["speculation"]["drafted_tokens"] for s in on["samples"])
    accepted = sum(s["speculation"]["accepted_tokens"] for s in on["samples"])
    assert drafted > 0
    assert abs(_mean_logprob(on) - _mean_logprob(off)) < LOGPROB_TOLERANCE, (
        f"mean logprob per sampled token {_mean_logprob(on):.3f} with {method} against "
        f"{_mean_logprob(off):.3f} without (acceptance {accepted}/{drafted})"
    )


@engines
def test_drafted_and_accepted_tokens_are_in_the_reply_state_metrics_and_record(
    ngram: dict[str, Any], off: dict[str, Any]
) -> None:
    step = ngram["greedy"]["speculation"]
    assert step["drafted_tokens"] >= step["accepted_tokens"] > 0
    assert step["decode_steps"] == GREEDY_TOKENS - step["accepted_tokens"]
    state = ngram["state"]["speculation"]
    assert (state["method"], state["num_speculative_tokens"]) == ("ngram", 4)
    assert state["drafted_tokens"] >= state["accepted_tokens"] > 0
    counted = dict(re.findall(r"^(heddle_worker_\w+_total) (\S+)$", ngram["metrics"], re.M))
    replies = [ngram["greedy"], *ngram["samples"]]
    assert float(counted["heddle_worker_drafted_tokens_total"]) >= sum(
        r["speculation"]["drafted_tokens"] for r in replies
    )
    assert float(counted["heddle_worker_accepted_tokens_total"]) >= step["accepted_tokens"]
    record = ngram["record"]["speculation"]
    assert record["accepted_tokens"] > 0
    assert record["tokens_per_decode_step"] > 1.0
    # Without speculation: nothing speculative anywhere.
    assert off["greedy"]["speculation"] is None and off["state"]["speculation"] is None
    assert "speculation" not in off["record"]


# Run in a fresh interpreter, as vLLM's worker process is: vLLM's kernel registration scans
# every loaded module, and a module another test loaded (seen in CI: an object whose
# ``vars()`` is not a dict) breaks that scan, which has nothing to do with the fault.
_EXPAND_CHECK = """
import json, torch
from vllm.platforms import current_platform
from vllm.v1.sample import rejection_sampler
from heddle.worker._vllm_patches import apply_patches

current_platform.register_triton_kernel_overrides()  # what vLLM's worker does first
results = apply_patches()
temperature = torch.tensor([0.7, 0.0, 1.3])
expanded = rejection_sampler.expand_batch_to_tokens(
    temperature, torch.tensor([2, 3, 6], dtype=torch.int32), 6, replace_from=0, replace_to=1
)
print(json.dumps({"expanded": expanded.tolist(), "expand": results["expand"]}))
"""


def test_the_cpu_builds_expand_fault_is_found_and_fixed_in_process() -> None:
    """Fault 1 without an engine: vLLM's CPU kernels registered as in a worker, the
    rejection sampler's float expansion is wrong; apply_patches finds and fixes it.
    With HEDDLE_VLLM_PATCHES=0 nothing is fixed and this fails (checked by hand)."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _EXPAND_CHECK],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["expanded"] == pytest.approx([0.7, 0.7, 1.0, 1.3, 1.3, 1.3])
    assert result["expand"] in {"patched", "absent"}  # absent: a vLLM that fixed it
