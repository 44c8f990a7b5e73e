"""The gateway in front of real vLLM workers (CPU build, the tiny model): agents written
with the ``openai`` SDK, several turns each, records checked against the tokenizer's own
chat template over the whole conversation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from heddle.api import SamplingSpec
from heddle.rollout import LocalPool
from heddle.worker import WorkerEndpoint

from .._rollout_fixtures import assert_exactly_once, read_records, start_pool
from .._vllm import require_vllm
from .test_gateway import CALC, Served, _chat, _tasks, serving

pytestmark = pytest.mark.slow  # real engines

require_vllm()


@pytest.fixture(scope="module")
def tiny_worker(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalPool, list[WorkerEndpoint], Path]]:
    from heddle.worker._tiny_model import write_tiny_model

    tmp = tmp_path_factory.mktemp("vllm-gateway")
    model = write_tiny_model(tmp / "model")
    pool, workers = start_pool([1], tmp, engine="vllm", model=str(model), max_model_len=4096)
    try:
        yield pool, workers, model
    finally:
        asyncio.run(pool.stop())


async def _agent(served: Served, seen: dict[str, Any], turns: int) -> None:
    """Episodes of ``turns`` calls: the model's reply sent back as received, then a user turn."""
    while (ep := await served.episode())["id"] is not None:
        eid = ep["id"]
        messages: list[dict[str, Any]] = [dict(m) for m in ep["task"]["messages"]]
        usage = []
        for turn in range(turns):
            stream = (ep["sample"] + turn) % 2 == 1
            message, _ = await _chat(served, eid, messages, stream=stream, header=turn % 2 == 0)
            messages.append(message)
            for call in message.get("tool_calls") or []:  # the random model may call one
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "1"})
            messages.append({"role": "user", "content": f"and now step {turn + 1}?"})
            usage.append(message)
        seen[eid] = messages[:-1]  # the last user turn was never sent
        assert (await served.end(eid, reward=0.5)).status_code == 200


def test_sdk_agents_on_vllm_get_records_equal_to_a_full_re_render(
    tiny_worker: tuple[LocalPool, list[WorkerEndpoint], Path], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    _, workers, model = tiny_worker
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    out = tmp_path / "out.jsonl"
    tasks, samples, turns = _tasks(4), 4, 3
    seen: dict[str, Any] = {}
    sampling = SamplingSpec(temperature=1.0, max_tokens_per_turn=16, max_total_tokens=200)

    async def main() -> None:
        async with serving(workers, out, tasks, samples, sampling=sampling, max_turns=8) as s:
            await asyncio.gather(*(_agent(s, seen, turns) for _ in range(4)))
            await s.run

    asyncio.run(main())
    records = read_records(out)
    assert_exactly_once(records, {(t.id, s) for t in tasks for s in range(samples)})
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for r in records:
        assert r["turns"] == turns and r["reward"] == 0.5, r["error"]
        sent = seen[r["episode"]["id"]]
        prompt = tokenizer.apply_chat_template(
            sent[:1], tools=CALC, add_generation_prompt=True, tokenize=False
        )
        assert r["prompt_token_ids"] == tokenizer.encode(prompt, add_special_tokens=False)
        # The model's turns are the mask's runs of 1; the rest is template and messages.
        tokens = r["prompt_token_ids"] + r["response_token_ids"]
        mask = [0] * len(r["prompt_token_ids"]) + r["response_mask"]
        spans: list[list[int]] = []
        for t, m, before in zip(tokens, mask, [0, *mask], strict=False):
            if m and not before:
                spans.append([])
            if m:
                spans[-1].append(t)
        assert len(spans) == turns
        # A last turn cut at max_tokens_per_turn is truncated (length), never done (stop).
        if spans[-1][-1] == end:
            assert (r["status"], r["finish_reason"]) == ("done", "stop")
        else:
            assert (r["status"], r["finish_reason"]) == ("truncated", "length")
        # A full re-render: the whole conversation through the tokenizer's template, each
        # assistant turn being the text the model generated (tool calls as it wrote them).
        generated = iter(spans)
        conversation = []
        for m in sent:
            if m["role"] == "assistant":
                span = next(generated)
                text = tokenizer.decode(span[:-1] if span[-1] == end else span)
                conversation.append({"role": "assistant", "content": text})
            else:
                conversation.append(m)
        full = tokenizer.apply_chat_template(conversation, tools=CALC, tokenize=False)
        last = spans[-1]
        full = full.removesuffix("\n") if last[-1] == end else full.removesuffix("<|im_end|>\n")
        assert tokenizer.decode(tokens) == full
        assert len(r["response_token_ids"]) > sum(len(s) for s in spans)  # user turns appended
