"""K from measured acceptance on a real vLLM worker (CPU build, SmolLM2).

The engine speculates as ``auto`` does on a GPU: vLLM runs suffix decoding at K=4, and
Heddle's proposer patch caps each step's K by the table in vLLM's worker process, which
starts as ``auto``'s table (on this build: K 1 up to a batch of 3, off above) and is
rebuilt from what the drafts gave. (``auto`` itself starts a CPU engine without
speculation, where it measured slower; the mechanism is the same, so it is given here.) Greedy
decoding makes the checks exact: once the engine has served the continuation, its
suffix tree holds it and nearly every draft is taken, so an uncapped engine would
draft several tokens per step; the cap must hold, the rebuilt table must follow the
acceptance, and the tokens must not change with K.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.worker import (
    Sampling,
    Speculation,
    StepOutput,
    VLLMConfig,
    VLLMEngine,
    auto_table,
    create_app,
    ensure_smollm2,
)

from .._vllm import needs_suffix, require_vllm
from .test_drafts_vllm import NEAR_TIE, _first_difference, _logit_gap

pytestmark = [pytest.mark.slow, needs_suffix]

require_vllm()

PROMPT = (
    "Repeat this list three times: apples, pears, plums, cherries, grapes, lemons, limes, melons."
)
ENGINE = {"max_num_seqs": 8, "max_model_len": 1024}
GREEDY = Sampling(max_tokens=64, temperature=0.0, ignore_eos=True)


async def _scenario(model: Path) -> dict[str, Any]:
    start = auto_table("suffix", model=str(model), tp=1, cpu_build=True, max_k=4, **ENGINE)
    speculation = Speculation("suffix", 4, start, k_measured=True)  # as auto on a GPU
    engine = VLLMEngine(
        VLLMConfig(model=str(model), block_size=32, speculation=speculation, **ENGINE)
    )
    await engine.start()
    got: dict[str, Any] = {"speculation": engine.speculation, "model": model}
    try:
        ctx = engine.encode(engine.render_chat([{"role": "user", "content": PROMPT}], True))
        got["ctx"] = ctx
        got["start"] = await engine.k_table()
        got["first"] = await engine.step("first", ctx, GREEDY, 0)  # batch of one: K <= 1
        # Eight at once, the tree holding their continuation: K 0 at a batch of 4 to 8.
        got["eight"] = await asyncio.gather(
            *(engine.step(f"eight-{i}", ctx, GREEDY, 0) for i in range(8))
        )
        got["after_eight"] = await engine.k_table()
        # A short cadence from here (the same start table): rebuilt every 16 request-steps.
        settings = {"method": "suffix", "model": str(model), "tp": 1, "cpu_build": True,
                    "max_k": 4, "rebuild_every_steps": 16, **ENGINE}  # fmt: skip
        await engine._llm.collective_rpc("heddle_measure_k", args=(settings,))
        got["learning"] = [await engine.step(f"learn-{i}", ctx, GREEDY, 0) for i in range(3)]
        got["learned"] = await engine.k_table()
        got["last"] = await engine.step("last", ctx, GREEDY, 0)
        transport = httpx.ASGITransport(app=create_app(engine, engine_started=True))
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as http:
            got["state"] = (await http.get("/v1/state")).json()["speculation"]
    finally:
        await engine.shutdown()
    return got


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    return asyncio.run(_scenario(ensure_smollm2(install=False)))


def _drafts(out: StepOutput) -> tuple[int, int]:
    return out.drafted_tokens or 0, out.draft_steps or 0


def test_suffix_runs_at_k4_capped_by_autos_start_table(run: dict[str, Any]) -> None:
    spec = run["speculation"]
    assert (spec.method, spec.num_speculative_tokens, spec.k_measured) == ("suffix", 4, True)
    start = auto_table("suffix", model="m", tp=1, cpu_build=True, max_k=4, **ENGINE)
    assert run["start"]["by_batch_size"] == [list(row) for row in start]
    assert run["start"]["rebuilds"] == 0 and run["start"]["alpha"] is None


def test_the_cap_holds_at_every_step(run: dict[str, Any]) -> None:
    drafted, steps = _drafts(run["first"])
    assert 0 < drafted <= steps  # it drafted, one token per verified step at most
    eight = [_drafts(out) for out in run["eight"]]
    assert all(d <= s for d, s in eight)
    # Uncapped (K=4 with the continuation in the tree) each would draft about 50 tokens;
    # at a batch of 4 to 8 the table says off, so only steps at a smaller batch draft.
    assert sum(d for d, _ in eight) < 64, eight


def test_the_table_is_rebuilt_from_the_acceptance_it_measures(run: dict[str, Any]) -> None:
    # The default cadence (2,048 request-steps) did not come round in ~600 steps.
    assert run["after_eight"]["rebuilds"] == 0 and run["after_eight"]["measured_steps"] > 0
    learned = run["learned"]
    # Well above the acceptance the start table assumes (about 0.23 per draft: 1.29
    # tokens per step at K=4), which still weighs in the first rebuilds.
    assert learned["rebuilds"] >= 2 and learned["alpha"] >= 0.45, learned
    assert learned["by_batch_size"][0][2] >= 3  # K at a batch of one, up from 1
    assert learned["measured_tokens_per_step"] > 1.5
    drafted, steps = _drafts(run["last"])
    assert drafted > steps  # now more than one draft per verified step
    assert run["state"]["by_batch_size"] == run["state"]["measured"]["by_batch_size"]
    assert run["state"]["measured"]["rebuilds"] >= learned["rebuilds"]


def test_the_tokens_do_not_change_with_k(run: dict[str, Any]) -> None:
    # Every run after the first finds the prompt in the prefix cache: from there, at K 0
    # (the batch of eight), 1 and up to 4, the same tokens. The first (prefilled whole)
    # may part from them only at a near-tie of the model itself, shown by its own logits
    # (as in test_drafts_vllm): drafts change nothing but the shapes a step runs in.
    reference = run["learning"][0].token_ids
    assert len(reference) == 64
    for out in [*run["eight"], *run["learning"], run["last"]]:
        assert out.token_ids == reference
    first = run["first"].token_ids
    i = _first_difference(reference, first)
    if i is not None:
        pair = (reference[i], first[i])
        gap, top = _logit_gap(run["model"], run["ctx"] + reference[:i], pair)
        assert gap <= NEAR_TIE and set(pair) <= set(top), (i, pair, gap, top)


# vLLM's suffix proposer driven step by step without an engine, in a fresh interpreter
# (as vLLM's worker process is; see test_speculation_vllm._EXPAND_CHECK): a stand-in input
# batch, arctic-inference's real cache, Heddle's cap on top of the suffix-k fix.
_PROPOSER_STEPS = """
import json, types
import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache
from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer
from heddle.scheduler import KTableSettings
from heddle.worker._auto_speculation import measured_k_table
from heddle.worker._vllm_patches import k_table_state, measure_k

text = [5, 6, 7, 8] * 40  # a repeating response: the tree drafts it whole
proposer = object.__new__(SuffixDecodingProposer)
proposer.num_speculative_tokens, proposer.max_tree_depth = 4, 24
proposer.max_spec_factor, proposer.min_token_prob, proposer.max_model_len = 1.0, 0.1, 1024
proposer.suffix_cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=100)
proposer.suffix_cache.start_request("old", np.array([1, 2, 3], dtype=np.int32))
proposer.suffix_cache.add_active_response("old", text)
proposer.suffix_cache.stop_request("old")
table = measured_k_table(method="suffix", model="m", tp=1, max_num_seqs=8, max_model_len=1024,
                         cpu_build=True, max_k=4, rebuild_every_steps=8)
assert measure_k(table)
batch = types.SimpleNamespace(req_ids=["a"], req_id_to_index={"a": 0},
                              num_prompt_tokens=np.array([3]),
                              token_ids_cpu=np.zeros((1, 1024), dtype=np.int32),
                              num_tokens_no_spec=np.array([3]), spec_token_ids=[[]])
batch.token_ids_cpu[0, :3] = [1, 2, 3]
out, n, sampled, drafted = [], 3, [text[0]], []
for step in range(60):
    batch.token_ids_cpu[0, n:n + len(sampled)] = sampled
    n += len(sampled)
    batch.num_tokens_no_spec[0] = n
    draft = SuffixDecodingProposer.propose(proposer, 4, batch, [list(sampled)])[0]
    drafted.append(len(draft))
    batch.spec_token_ids = [list(draft)]
    sampled = draft + [text[(n - 3 + len(draft)) % len(text)]]  # every draft taken
counted = k_table_state()["measured_steps"]
# vLLM skipped the drafts of that step (e.g. a request near its length limit): the step
# verified nothing of what was drafted, and is not counted as a rejection.
batch.spec_token_ids = [[]]
batch.token_ids_cpu[0, n] = 5
batch.num_tokens_no_spec[0] = n + 1
SuffixDecodingProposer.propose(proposer, 4, batch, [[5]])
print(json.dumps({"drafted": drafted, "state": k_table_state(), "counted": counted,
                  "configured": proposer.num_speculative_tokens}))
"""


def test_the_cap_drafts_at_most_the_tables_k_and_learns_from_what_was_verified() -> None:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _PROPOSER_STEPS], check=False, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    drafted = got["drafted"]
    # The start table (CPU build, cap 8): K 1 at a batch of one. Every draft is taken, so
    # as the assumed acceptance fades (by half at each rebuild, every 8 request-steps)
    # the table drafts more, up to 4; never more than it says.
    assert drafted[:8] == [1] * 8, drafted
    assert drafted == sorted(drafted) and drafted[-1] == 4, drafted
    assert got["state"]["rebuilds"] >= 1 and got["state"]["alpha"] >= 0.5
    assert got["counted"] == 59  # every step after the first (which had no draft before)
    assert got["state"]["measured_steps"] == 59  # the skipped drafts were not counted
    assert got["configured"] == 4  # the proposer's own K is put back after each step
