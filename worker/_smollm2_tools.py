"""SmolLM2's chat template with tool schemas, installed into the converted folder.

The template inside the GGUF renders the conversation only: handed ``tools=``
it drops them, so the model never sees a schema. SmolLM2-Instruct was tuned
for function calling (Argilla's Synth-APIGen data, as its model card says)
with the schemas in a system prompt between ``<tools>`` tags and the calls
answered as a JSON list, ``<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>``:
the format vLLM's ``xlam`` tool parser reads (``hermes`` expects one object per
tag and finds nothing in a list). This template is the GGUF's own wherever no
tools are given (byte for byte: every conversation without tools renders as
before), and with tools it opens with that system prompt, renders an
assistant turn's ``tool_calls`` in the same format, and tool replies as
``tool`` turns. docs/rollouts.md ("A real model's tool calls") has the rate at
which the 135M model emits a valid call.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SMOLLM2_TOOLS_TEMPLATE", "SMOLLM2_TOOL_PARSER", "install_tool_template"]

SMOLLM2_TOOL_PARSER = "xlam"  # the vLLM parser that reads the format below

# The system prompt is the one SmolLM2's function-calling data uses (its card's format).
_TOOLS_SYSTEM = (
    "You are an expert in composing functions. You are given a question and a set of "
    "possible functions. \\nBased on the question, you will need to make one or more "
    "function/tool calls to achieve the purpose. \\nIf none of the functions can be used, "
    "point it out and refuse to answer. \\nIf the given question lacks the parameters "
    "required by the function, also point it out.\\n\\nYou have access to the following "
    "tools:\\n<tools>"
)
_TOOLS_FORMAT = (
    "</tools>\\n\\nThe output MUST strictly adhere to the following format, and NO other "
    "text MUST be included.\\nThe example format is as follows. Please make sure the "
    "parameter type is correct. If no function call is needed, please make the tool calls "
    'an empty list \\\'[]\\\'.\\n<tool_call>[\\n{\\"name\\": \\"func_name1\\", '
    '\\"arguments\\": {\\"argument1\\": \\"value1\\", \\"argument2\\": '
    '\\"value2\\"}},\\n... (more tool calls as required)\\n]</tool_call>'
)

SMOLLM2_TOOLS_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '" + _TOOLS_SYSTEM + "[' }}"
    "{%- for tool in tools %}"
    "{{- (tool['function'] if tool['function'] is defined else tool) | tojson }}"
    "{%- if not loop.last %}{{- ', ' }}{%- endif %}"
    "{%- endfor %}"
    "{{- ']" + _TOOLS_FORMAT + "<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{- '<tool_call>[' }}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{%- set args = fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson %}"
    "{{- '{\"name\": ' + (fn['name'] | tojson) + ', \"arguments\": ' + args + '}' }}"
    "{%- if not loop.last %}{{- ', ' }}{%- endif %}"
    "{%- endfor %}"
    "{{- ']</tool_call>' }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    "{%- else %}"
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
    "{%- endif %}"
)


def install_tool_template(folder: Path) -> None:
    """Write the template into a converted SmolLM2 folder (idempotent; not in its weights'
    checksum, so a cached folder gets it on its next use)."""
    path = folder / "chat_template.jinja"
    try:
        if path.read_text(encoding="utf-8") == SMOLLM2_TOOLS_TEMPLATE:
            return
    except OSError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(SMOLLM2_TOOLS_TEMPLATE, encoding="utf-8")
    tmp.replace(path)  # atomic: a worker starting now reads the old file or the new one
