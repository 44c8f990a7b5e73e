"""Tool schemas and tool-call parsers from the job and the task rows to the record's messages."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from heddle.api import RolloutJobSpec, ToolEndpointSpec, ToolsSpec
from heddle.exceptions import ManifestError, TaskError
from heddle.rollout import ParsedCalls, Task, ToolsEnvironment, parse_task
from heddle.worker import TOOL_PARSERS

from .._rollout_fixtures import ToolServer
from ..operator._cluster import validate

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str, **properties: Any) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


CALC = _tool("calc", x={"type": "integer"})


def _job(**tools: Any) -> dict[str, Any]:
    spec = {"endpoints": [{"name": "calc", "url": "http://calc"}], **tools}
    return {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "j"},
        "spec": {
            "enginePool": "p",
            "tasks": {"path": "tasks.jsonl"},
            "environment": {"type": "tools", "tools": spec},
            "output": {"path": "/data/out.jsonl"},
        },
    }


def test_a_job_names_any_of_vllms_parsers_and_its_tool_schemas() -> None:
    job = RolloutJobSpec.from_manifest(_job(parser="qwen3_coder", schemas=[CALC]))
    assert job.environment.tools is not None
    assert job.environment.tools.parser == "qwen3_coder"
    assert job.environment.tools.schemas == (CALC,)


def test_an_unknown_parser_is_refused_listing_the_valid_ones() -> None:
    with pytest.raises(ManifestError) as caught:
        RolloutJobSpec.from_manifest(_job(parser="qwen4"))
    message = str(caught.value)
    assert message.startswith("RolloutJob 'j' spec.environment.tools.parser='qwen4'; choose one of")
    assert "'hermes'" in message and "'qwen3_coder'" in message and "'llama3_json'" in message


@pytest.mark.parametrize(
    ("schema", "error"),
    [
        (
            {"type": "function", "function": {"name": "calc", "parameters": {"type": "array"}}},
            'schemas[0].function.parameters must be a JSON Schema with "type": "object"',
        ),
        (_tool("search"), "schemas[0] describes tool 'search', which no endpoint serves"),
    ],
)
def test_a_bad_tool_schema_is_refused_naming_the_field(schema: Any, error: str) -> None:
    with pytest.raises(ManifestError) as caught:
        RolloutJobSpec.from_manifest(_job(schemas=[schema]))
    assert str(caught.value).startswith("RolloutJob 'j' spec.environment.tools." + error)


def test_the_crd_offers_the_parsers_the_worker_knows() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "rolloutjobs.heddle.dev.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    tools = spec["properties"]["environment"]["properties"]["tools"]["properties"]
    assert tuple(tools["parser"]["enum"]) == TOOL_PARSERS
    assert tools["schemas"]["items"]["x-kubernetes-preserve-unknown-fields"] is True


def test_a_task_row_brings_its_own_tools() -> None:
    task = parse_task({"id": "t", "prompt": "2+2?", "tools": [CALC]}, "line 1", "0")
    assert task.tools == (CALC,)
    assert parse_task({"prompt": "hi"}, "line 2", "1").tools is None
    with pytest.raises(TaskError, match=r"line 3: tools\[0\].function.name='a b' must be"):
        parse_task({"prompt": "hi", "tools": [_tool("a b")]}, "line 3", "2")
    with pytest.raises(TaskError, match="line 4: tools must be a list of OpenAI function tools"):
        parse_task({"prompt": "hi", "tools": CALC}, "line 4", "3")


def _env(server: ToolServer, **spec: Any) -> ToolsEnvironment:
    endpoint = ToolEndpointSpec("calc", server.url + "/ok", timeout_s=2.0, retries=0)
    return ToolsEnvironment(ToolsSpec(endpoints=(endpoint,), **spec))


def test_the_task_tools_replace_the_jobs_for_the_template(tool_server: ToolServer) -> None:
    env = _env(tool_server, parser="qwen3_coder", schemas=(CALC,))
    own = copy.deepcopy(CALC)
    own["function"]["description"] = "this task's calculator"
    plain = env.episode(Task("a", ({"role": "user", "content": "hi"},)), 0, 0, "a-0")
    custom = env.episode(Task("b", ({"role": "user", "content": "hi"},), tools=(own,)), 1, 0, "b-0")
    assert plain.chat_tools() == ((CALC,), "qwen3_coder")
    assert custom.chat_tools() == ((own,), "qwen3_coder")
    asyncio.run(env.close())


def test_calls_the_worker_parsed_are_run_and_recorded_in_openai_format(
    tool_server: ToolServer,
) -> None:
    env = _env(tool_server)
    episode = env.episode(Task("a", ({"role": "user", "content": "hi"},)), 0, 0, "a-0")
    call = {"id": "chatcmpl-tool-1", "type": "function"}
    call["function"] = {"name": "calc", "arguments": '{"x": 2}'}
    bad = {"id": "chatcmpl-tool-2", "type": "function"}
    bad["function"] = {"name": "calc", "arguments": "[1]"}
    # The text says nothing the regex would find: the worker's parse is what counts.
    parsed = ParsedCalls("Let me add.", [call, bad])
    outcome = asyncio.run(episode.after_turn(0, "<function=calc>...", "stop", parsed))
    asyncio.run(env.close())
    assert outcome.assistant == {
        "role": "assistant",
        "content": "Let me add.",
        "tool_calls": [call],
    }
    assert outcome.tool_calls == ("calc",) and outcome.tool_errors == 1
    errors, result = outcome.messages
    assert errors == {
        "role": "tool",
        "content": "error: tool call 'calc': arguments must be a JSON object",
    }
    assert result == {
        "role": "tool",
        "content": 'calc says {"x": 2}',
        "tool_call_id": "chatcmpl-tool-1",
    }


def test_a_turn_without_calls_ends_the_trajectory(tool_server: ToolServer) -> None:
    env = _env(tool_server)
    episode = env.episode(Task("a", ({"role": "user", "content": "hi"},)), 0, 0, "a-0")
    outcome = asyncio.run(episode.after_turn(0, "4", "stop", ParsedCalls("4", [])))
    asyncio.run(env.close())
    assert outcome.done and outcome.assistant is None


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["search", "coding", "math"])
def test_the_paper_jobs_with_tool_schemas_pass_the_crd_schema(workload: str) -> None:
    job = yaml.safe_load((ROOT / "examples" / "paper" / f"job-{workload}.yaml").read_text())
    validate("rolloutjobs", job)
    bad = copy.deepcopy(job)
    bad["spec"]["environment"]["tools"]["parser"] = "qwen4"
    with pytest.raises(jsonschema.ValidationError, match="'qwen4' is not one of"):
        validate("rolloutjobs", bad)
