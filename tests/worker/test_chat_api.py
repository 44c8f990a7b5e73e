"""Chat fields of the generate request on the simulated engine: tools, tool_parser, appending."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from heddle.worker import SimulatedEngine

from .conftest import worker

pytestmark = pytest.mark.anyio

Build = Callable[..., SimulatedEngine]
URL = "/v1/trajectories/c/generate"


def chat(content: str, role: str = "user", **extra: object) -> dict[str, object]:
    return {
        "messages": [{"role": role, "content": content}],
        "sampling": {"max_tokens": 4},
        **extra,
    }


async def test_messages_after_a_turn_close_it_and_add_only_themselves(sim_engine: Build) -> None:
    async with worker(sim_engine()) as client:
        first = (await client.post(URL, json=chat("add 2 and 2"))).json()
        tool = {"role": "tool", "content": "4", "tool_call_id": "call_1"}
        body = {"messages": [tool], "sampling": {"max_tokens": 4}}
        second = (await client.post(URL, json=body)).json()
        # The sim's template ends a turn with "\n", which its random text never generates.
        assert bytes(second["appended_token_ids"]).decode() == "\n<|tool|>\n4\n<|assistant|>\n"
        assert second["prompt_tokens"] == first["context_tokens"] + len(
            second["appended_token_ids"]
        )


async def test_a_tool_schema_that_is_not_an_openai_function_gets_one_sentence(
    sim_engine: Build,
) -> None:
    bad = [
        {"type": "function", "function": {"name": "search"}},
        {"type": "function", "function": {"name": "two words", "parameters": {}}},
    ]
    async with worker(sim_engine()) as client:
        reply = await client.post(URL, json=chat("hi", tools=bad))
    assert reply.status_code == 422
    error = reply.json()["error"]
    assert error.startswith("invalid request: tools[1].function.name='two words' must be"), error
    assert "Value error" not in error and "Traceback" not in error


async def test_an_unknown_tool_parser_is_refused_listing_vllms(sim_engine: Build) -> None:
    async with worker(sim_engine()) as client:
        reply = await client.post(URL, json=chat("hi", tool_parser="hermes2"))
    assert reply.status_code == 422
    error = reply.json()["error"]
    assert "tool_parser='hermes2' is not one of vLLM's tool parsers" in error
    assert "hermes" in error and "qwen3_coder" in error and "llama3_json" in error


async def test_the_sim_engine_leaves_tool_calls_to_the_caller(sim_engine: Build) -> None:
    async with worker(sim_engine()) as client:
        reply = (await client.post(URL, json=chat("hi", tool_parser="hermes"))).json()
    assert reply["tool_calls"] is None and reply["content"] is None
    assert isinstance(reply["text"], str)
