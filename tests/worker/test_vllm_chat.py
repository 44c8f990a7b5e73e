"""Chat on a real vLLM worker: tools in the template, turns appended as a re-render would,
tool calls read by vLLM's own parsers. The tiny model's template is Qwen2.5-style."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.exceptions import EngineInputError
from heddle.worker import TOOL_PARSERS

from .._vllm import require_vllm
from .test_process import free_port
from .test_vllm import start_worker, wait_ready

pytestmark = pytest.mark.slow  # real processes or engines; `-m 'not slow'` skips them

require_vllm()

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from heddle.worker._tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def url(model: Path) -> Iterator[str]:
    port = free_port()
    proc = start_worker(model, port)
    address = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, address)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_the_parser_names_a_job_may_give_are_vllms() -> None:
    from vllm.tool_parsers import ToolParserManager

    assert tuple(ToolParserManager.list_registered()) == TOOL_PARSERS


def test_vllms_parsers_read_tool_calls_in_their_models_formats(model: Path) -> None:
    from transformers import AutoTokenizer

    from heddle.worker._tool_parsing import VLLMToolParsers

    parsers = VLLMToolParsers(AutoTokenizer.from_pretrained(model), "tiny")
    hermes = parsers.parse(
        'Looking. <tool_call>\n{"name": "search", "arguments": {"query": "heddle"}}\n</tool_call>',
        "hermes",
        TOOLS,
    )
    assert hermes.content == "Looking. "
    assert [(name, args) for _, name, args in hermes.tool_calls] == [
        ("search", '{"query": "heddle"}')
    ]
    coder = parsers.parse(
        "<tool_call>\n<function=search>\n<parameter=query>\nheddle\n</parameter>\n"
        "</function>\n</tool_call>",
        "qwen3_coder",
        TOOLS,
    )
    assert [(name, args) for _, name, args in coder.tool_calls] == [
        ("search", '{"query": "heddle"}')
    ]
    assert parsers.parse("no call here", "hermes", TOOLS).tool_calls == []
    with pytest.raises(EngineInputError, match="tool_parser='llama3_json' does not fit"):
        parsers.parse("{}", "llama3_json", TOOLS)


def test_a_conversation_grows_by_what_its_full_rerender_adds(url: str, model: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    first = [{"role": "user", "content": "Find heddle."}]
    sampling = {"max_tokens": 6, "seed": 3, "ignore_eos": True}
    body = {"messages": first, "tools": TOOLS, "tool_parser": "hermes", "sampling": sampling}
    one = httpx.post(f"{url}/v1/trajectories/chat/generate", json=body, timeout=120).json()
    # The first turn is the template's whole render: default system prompt and tool schemas.
    expected = tokenizer.apply_chat_template(
        first, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert tokenizer.decode(one["appended_token_ids"]) == expected
    assert "You are a helpful assistant." in expected and '"name": "search"' in expected
    assert isinstance(one["tool_calls"], list) and isinstance(one["content"], str)

    tool = {"role": "tool", "content": "found", "tool_call_id": "call_0"}
    body = {"messages": [tool], "tools": TOOLS, "tool_parser": "hermes", "sampling": sampling}
    two = httpx.post(f"{url}/v1/trajectories/chat/generate", json=body, timeout=120).json()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # Cut at max tokens (EOS ignored), the turn is closed as the template closes it; no
    # second system prompt.
    closing = "\n" if one["token_ids"][-1] == end else "<|im_end|>\n"
    assert tokenizer.decode(two["appended_token_ids"]) == (
        f"{closing}<|im_start|>user\n<tool_response>\nfound\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    context = httpx.get(f"{url}/v1/trajectories/chat", timeout=30).json()["token_ids"]
    assert context == [
        *one["appended_token_ids"],
        *one["token_ids"],
        *two["appended_token_ids"],
        *two["token_ids"],
    ]


def test_a_parser_that_does_not_fit_the_model_is_refused_before_the_step(url: str) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "tool_parser": "llama3_json",
        "sampling": {"max_tokens": 2},
    }
    reply = httpx.post(f"{url}/v1/trajectories/misfit/generate", json=body, timeout=120)
    assert reply.status_code == 422
    assert "tool_parser='llama3_json' does not fit this model's tokenizer" in reply.json()["error"]
    assert httpx.get(f"{url}/v1/trajectories/misfit", timeout=30).status_code == 404
