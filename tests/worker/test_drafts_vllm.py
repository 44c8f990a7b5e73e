"""Seeding a suffix engine's cache through ``POST /v1/drafts`` (real vLLM, SmolLM2).

A GRPO sibling that ran on another engine is a text this engine's suffix tree lacks.
Greedy decoding makes the check exact: the sibling's text is the continuation the
engine will produce, so once seeded nearly every draft is accepted, and the output
stays the same token for token (drafts never change what is sampled).
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

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


async def _scenario(model: Path) -> dict[str, Any]:
    engine = VLLMEngine(
        VLLMConfig(
            model=str(model),
            max_model_len=1024,
            block_size=32,
            max_num_seqs=4,
            speculation=Speculation.of("suffix", 4),
        )
    )
    await engine.start()
    try:
        ctx = engine.encode(engine.render_chat([{"role": "user", "content": PROMPT}], True))
        greedy = Sampling(max_tokens=96, temperature=0.0)

        async def clear() -> None:  # an engine that has served nothing of this prompt
            await engine._llm.collective_rpc("heddle_clear_drafts")

        sibling = await engine.step("sibling", ctx, greedy, 0)  # as if run elsewhere
        await clear()
        plain = await engine.step("plain", ctx, greedy, 0)
        await clear()
        app = create_app(engine, engine_started=True)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as http:
            body = {"job": "j", "task_id": "story", "texts": [sibling.token_ids]}
            first = (await http.post("/v1/drafts", json=body)).json()
            again = (await http.post("/v1/drafts", json=body)).json()
        seeded = await engine.step("seeded", ctx, greedy, 0)
        return {"sibling": sibling, "plain": plain, "seeded": seeded, "replies": (first, again)}
    finally:
        await engine.shutdown()


@pytest.mark.slow
@needs_suffix
def test_a_seeded_siblings_text_is_drafted_from() -> None:
    got = asyncio.run(_scenario(ensure_smollm2(install=False)))
    sibling, plain, seeded = got["sibling"], got["plain"], got["seeded"]
    first, again = got["replies"]
    assert first == {"seeded": 1, "held": 1}
    assert again == {"seeded": 0, "held": 1}  # the same text is inserted once
    n = len(sibling.token_ids)
    assert n >= 48
    assert plain.token_ids == sibling.token_ids == seeded.token_ids  # drafts change nothing
    # Without the sibling the engine drafts only from this request's own text; with it,
    # from the very continuation it is producing.
    assert (seeded.accepted_tokens or 0) >= max(2 * (plain.accepted_tokens or 0), n // 2)
