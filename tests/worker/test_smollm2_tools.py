"""SmolLM2's chat template with tools: as before without tools, SmolLM2's format with them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers.utils.chat_template_utils import _compile_jinja_template

from heddle.worker import SMOLLM2_TOOL_PARSER, SMOLLM2_TOOLS_TEMPLATE, install_tool_template

SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}}
FUNCTION = {"name": "calculator", "description": "Evaluate.", "parameters": SCHEMA}
CALC = {"type": "function", "function": FUNCTION}


def _render(messages: list[dict[str, Any]], tools: Any = None, prompt: bool = True) -> str:
    # transformers' own Jinja environment (its tojson, trim_blocks): what apply_chat_template runs
    template = _compile_jinja_template(SMOLLM2_TOOLS_TEMPLATE)
    return str(template.render(messages=messages, tools=tools, add_generation_prompt=prompt))


@pytest.mark.parametrize("tools", [None, []])
def test_without_tools_it_renders_the_models_own_template(tools: Any) -> None:
    user = {"role": "user", "content": "What is 2+2?"}
    assert _render([user], tools) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    system = {"role": "system", "content": "Be brief."}
    assert _render([system, user], tools, prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    )


def test_with_tools_the_schemas_and_calls_are_in_smollm2s_format() -> None:
    call = {"id": "c0", "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "17*23"}'}}  # fmt: skip
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 17*23?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "391", "tool_call_id": "c0"},
    ]
    text = _render(messages, [CALC])
    head, _, rest = text.partition("<|im_end|>\n")
    assert head.startswith("<|im_start|>system\nBe brief.\n\nYou are an expert in composing")
    schemas = head.split("<tools>", 1)[1].split("</tools>", 1)[0]
    assert json.loads(schemas) == [CALC["function"]]  # the function itself, as SmolLM2 saw them
    assert rest == (
        "<|im_start|>user\nWhat is 17*23?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>[{"name": "calculator", "arguments": '
        '{"expression": "17*23"}}]</tool_call><|im_end|>\n'
        "<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\n"
    )
    assert SMOLLM2_TOOL_PARSER == "xlam"


def test_installing_the_template_replaces_the_models_and_is_idempotent(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    install_tool_template(tmp_path)
    assert (tmp_path / "chat_template.jinja").read_text() == SMOLLM2_TOOLS_TEMPLATE
    before = (tmp_path / "chat_template.jinja").stat().st_mtime_ns
    install_tool_template(tmp_path)
    assert (tmp_path / "chat_template.jinja").stat().st_mtime_ns == before
    assert not list(tmp_path.glob("*.tmp"))
