"""Seeding a suffix engine's cache through ``POST /v1/drafts`` (real vLLM, SmolLM2).

A GRPO sibling that ran on another engine is a text this engine's suffix tree lacks.
Greedy decoding makes the check exact: the sibling's text is the continuation the
engine will produce, so once seeded nearly every draft is accepted, and the output
stays the same token for token (drafts never change what is sampled) unless a
verification pass orders a near-tie the other way: then the numeric cause is shown
(the two tokens' logits, in the model run on its own, within float32 rounding).

The engine runs in float32: in bfloat16 a verification pass of other shapes rounds
logits 0.125 apart differently, and on some CPUs every prompt parted from its plain
run at such a tie before the drafting could be checked on the whole text.
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
    VLLMConfig,
    VLLMEngine,
    create_app,
    ensure_smollm2,
)

from .._vllm import needs_suffix, require_vllm

require_vllm()

PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain step by step how to make a cup of tea.",
    "List five facts about the planet Mars.",
)
# Two logits this close may be ordered either way by float32 sums taken in another order
# (a verification pass's shapes) through SmolLM2's 30 layers; a bfloat16 step at its
# logit scale (~16-32) is 0.125.
NEAR_TIE = 0.01


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _logit_gap(model: Path, context: list[int], tokens: tuple[int, int]) -> tuple[float, list[int]]:
    """The reference model's logit gap between ``tokens`` after ``context``, and its top 3."""
    import torch  # only where outputs differ
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(str(model), torch_dtype=torch.float32)
    with torch.no_grad():
        logits = net(torch.tensor([context])).logits[0, -1]
    top = [int(i) for i in torch.topk(logits, 3).indices]
    return abs(float(logits[tokens[0]] - logits[tokens[1]])), top


async def _scenario(model: Path) -> list[dict[str, Any]]:
    engine = VLLMEngine(
        VLLMConfig(
            model=str(model),
            max_model_len=1024,
            block_size=32,
            max_num_seqs=4,
            dtype="float32",  # see the module's docstring
            speculation=Speculation.of("suffix", 4),
        )
    )
    await engine.start()
    results: list[dict[str, Any]] = []
    try:
        greedy = Sampling(max_tokens=96, temperature=0.0)
        app = create_app(engine, engine_started=True)
        transport = httpx.ASGITransport(app=app)

        async def clear() -> None:  # an engine that has served nothing of this prompt
            await engine._llm.collective_rpc("heddle_clear_drafts")

        for n, prompt in enumerate(PROMPTS):
            ctx = engine.encode(engine.render_chat([{"role": "user", "content": prompt}], True))
            await clear()
            sibling = await engine.step(f"sibling-{n}", ctx, greedy, 0)  # as if run elsewhere
            await clear()
            plain = await engine.step(f"plain-{n}", ctx, greedy, 0)
            await clear()
            async with httpx.AsyncClient(transport=transport, base_url="http://worker") as http:
                body = {"job": "j", "task_id": f"story-{n}", "texts": [sibling.token_ids]}
                first = (await http.post("/v1/drafts", json=body)).json()
                again = (await http.post("/v1/drafts", json=body)).json()
            seeded = await engine.step(f"seeded-{n}", ctx, greedy, 0)
            results.append(
                {"ctx": ctx, "sibling": sibling, "plain": plain, "seeded": seeded,
                 "replies": (first, again)}
            )  # fmt: skip
    finally:
        await engine.shutdown()
    return results


@pytest.mark.slow
@needs_suffix
def test_a_seeded_siblings_text_is_drafted_from() -> None:
    model = ensure_smollm2(install=False)
    exact = 0
    for got in asyncio.run(_scenario(model)):
        sibling, plain, seeded = got["sibling"], got["plain"], got["seeded"]
        first, again = got["replies"]
        assert first == {"seeded": 1, "held": 1}
        assert again == {"seeded": 0, "held": 1}  # the same text is inserted once
        n = len(sibling.token_ids)
        assert n >= 48
        assert plain.token_ids == sibling.token_ids  # the same path, the same tokens
        i = _first_difference(plain.token_ids, seeded.token_ids)
        if i is not None:
            # Drafts change nothing but the shapes a step is verified in: the tokens may
            # part only where the model itself cannot tell them apart.
            pair = (plain.token_ids[i], seeded.token_ids[i])
            gap, top = _logit_gap(model, got["ctx"] + plain.token_ids[:i], pair)
            assert gap <= NEAR_TIE and set(pair) <= set(top), (i, pair, gap, top)
            continue
        exact += 1
        # Without the sibling the engine drafts only from this request's own text; with
        # it, from the very continuation it is producing.
        assert (seeded.accepted_tokens or 0) >= max(2 * (plain.accepted_tokens or 0), n // 2)
    assert exact >= 1, "no prompt ran without a near-tie: add one"
