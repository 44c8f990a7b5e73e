"""The external environment's gateway, driven by agents written with the ``openai`` SDK.

Real parts throughout: sim worker processes that answer each turn with the
prompt's next ``<reply>`` block, the session, the gateway on a real socket and
the SDK's own HTTP client.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from heddle.api import ExternalSpec, SamplingSpec
from heddle.rollout import (
    ExternalEnvironment,
    Gateway,
    LocalPool,
    OutputSink,
    RolloutSession,
    SessionConfig,
    SessionResult,
    Task,
)
from heddle.scheduler import HARDWARE_PRESETS, MODEL_PRESETS, PerfModel
from heddle.worker import WorkerEndpoint

from .._rollout_fixtures import assert_exactly_once, read_records

# Starts sim worker processes for the module: not the inner loop (README).
pytestmark = pytest.mark.slow

PERF = PerfModel(MODEL_PRESETS["qwen3-8b"], HARDWARE_PRESETS["h100-sxm"])
FAST = SessionConfig(replan_interval_s=0.2, health_interval_s=0.2, unhealthy_after=2)
TOKEN = "test-token"
MODEL = "tiny-model"
CALC = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "adds one",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
        },
    }
]


def _call(x: int) -> str:
    return f'<tool_call>{{"name": "calc", "arguments": {{"x": {x}}}}}</tool_call>'


@dataclass
class Served:
    env: ExternalEnvironment
    url: str
    client: openai.AsyncOpenAI
    http: httpx.AsyncClient
    run: asyncio.Task[SessionResult]
    session: RolloutSession

    async def episode(self) -> dict[str, Any]:
        reply = await self.http.post(f"{self.url}/episodes")
        assert reply.status_code == 200, reply.text
        data: dict[str, Any] = reply.json()
        return data

    async def end(self, episode: str, **body: Any) -> httpx.Response:
        return await self.http.post(f"{self.url}/episodes/{episode}/end", json=body)


@asynccontextmanager
async def serving(
    workers: list[WorkerEndpoint],
    out: Path,
    tasks: list[Task],
    samples: int,
    spec: ExternalSpec | None = None,
    **session: Any,
) -> AsyncIterator[Served]:
    """A session of an external job with its gateway; stopped (and awaited) on exit."""
    env = ExternalEnvironment(spec or ExternalSpec(), job="j", model=MODEL, token=TOKEN)
    gateway = Gateway(env)
    url = await gateway.start()
    options: dict[str, Any] = {
        "job": "j",
        "tasks": tasks,
        "samples_per_task": samples,
        "environment": env,
        "workers": workers,
        "sink": OutputSink(out),
        "perf": PERF,
        "sampling": SamplingSpec(max_tokens_per_turn=256, max_total_tokens=4000),
        "max_turns": 8,
        "config": FAST,
    } | session
    session = RolloutSession(**options)
    run = asyncio.create_task(session.run())
    headers = {"Authorization": f"Bearer {TOKEN}"}
    client = openai.AsyncOpenAI(base_url=url, api_key=TOKEN, max_retries=0)
    try:
        async with httpx.AsyncClient(headers=headers, timeout=30) as http:
            yield Served(env, url, client, http, run, session)
    finally:
        if not run.done():
            run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await client.close()
        await gateway.stop()


def _tasks(n: int) -> list[Task]:
    return [Task(f"task{i}", ({"role": "user", "content": f"question {i}"},)) for i in range(n)]


@dataclass
class Seen:
    """What one agent sent and received, per episode id."""

    sent: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    replies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    tasks: dict[str, tuple[str, int]] = field(default_factory=dict)


async def _agent(served: Served, seen: Seen, *, stream: bool) -> None:
    """Episodes until none is left: a tool call, its result, an answer, the end with a reward."""
    while True:
        ep = await served.episode()
        if ep["id"] is None:
            if ep["remaining"] == 0:
                return
            await asyncio.sleep(0.05)
            continue
        eid = ep["id"]
        seen.tasks[eid] = (ep["task"]["id"], ep["sample"])
        x = ep["task_index"] * 10 + ep["sample"]
        prompt = f"{ep['task']['messages'][0]['content']} <reply>{_call(x)}</reply>"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "you add"},
            {"role": "user", "content": prompt + f"<reply>answer {x}</reply>"},
        ]
        seen.replies[eid] = []
        for turn in range(2):
            message, finish = await _chat(served, eid, messages, stream=stream, header=turn == 0)
            seen.replies[eid].append({**message, "finish_reason": finish})
            messages.append(message)
            if message.get("tool_calls"):
                call = message["tool_calls"][0]
                args = json.loads(call["function"]["arguments"])
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": str(args["x"] + 1)}
                )
        seen.sent[eid] = messages
        ended = await served.end(eid, reward=float(x), info={"agent": "sdk"})
        assert ended.status_code == 200, ended.text


async def _chat(
    served: Served, eid: str, messages: list[dict[str, Any]], *, stream: bool, header: bool
) -> tuple[dict[str, Any], str]:
    """One call through the SDK; the id in the header or in ``user``."""
    extra: dict[str, Any] = (
        {"extra_headers": {"X-Heddle-Trajectory": eid}} if header else {"user": eid}
    )
    if not stream:
        reply = await served.client.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=CALC,
            **extra,  # type: ignore[arg-type]
        )
        choice = reply.choices[0]
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        return choice.message.model_dump(exclude_none=True), str(choice.finish_reason)
    chunks = await served.client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        tools=CALC,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
        **extra,
    )
    content, calls, finish, usage = "", [], "", None
    async for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for c in choice.delta.tool_calls or []:
                calls.append(
                    {"id": c.id, "type": "function",
                     "function": {"name": c.function.name, "arguments": c.function.arguments}}
                )  # fmt: skip
            finish = choice.finish_reason or finish
    assert usage is not None and usage.completion_tokens > 0
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    return message, finish


def _render_sim(messages: list[dict[str, Any]], generated: list[str]) -> str:
    """The sim engine's chat template over the whole conversation, the model's turns as
    it generated them (a full re-render, the reference for the token record)."""
    turns = iter(generated)
    text = ""
    for m in messages:
        content = next(turns) if m["role"] == "assistant" else m["content"]
        text += f"<|{m['role']}|>\n{content}\n"
    return text.removesuffix("\n")  # the last turn ends where the model stopped


def _spans(tokens: list[int], mask: list[int]) -> list[str]:
    """The model's turns: the runs of mask 1, decoded."""
    spans, current = [], bytearray()
    for t, m in zip(tokens, mask, strict=True):
        if m:
            current.append(t)
        elif current:
            spans.append(current.decode())
            current = bytearray()
    if current:
        spans.append(current.decode())
    return spans


def test_sdk_agents_run_many_episodes_with_tool_calls_and_token_exact_records(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = scripted_pool
    out = tmp_path / "out.jsonl"
    tasks, samples = _tasks(6), 4
    seen = Seen()

    async def main() -> SessionResult:
        async with serving(workers, out, tasks, samples) as served:
            models = await served.client.models.list()
            assert [m.id for m in models.data] == [MODEL]
            agents = [_agent(served, seen, stream=i % 2 == 1) for i in range(6)]
            await asyncio.gather(*agents)
            return await served.run

    result = asyncio.run(main())
    assert result.progress.done == 24 and result.steps == 48
    records = read_records(out)
    assert_exactly_once(records, {(t.id, s) for t in tasks for s in range(samples)})
    for r in records:
        eid = r["episode"]["id"]
        assert (r["task_id"], r["sample"]) == seen.tasks[eid]
        assert r["status"] == "done" and r["finish_reason"] == "stop", r["error"]
        x = r["task_index"] * 10 + r["sample"]
        assert r["reward"] == x and r["reward_info"] == {"agent": "sdk"}
        # The record's conversation is what the agent sent, replies as it received them.
        sent = seen.sent[eid]
        assert [m["role"] for m in r["messages"]] == [m["role"] for m in sent]
        replies = seen.replies[eid]
        assert replies[0]["finish_reason"] == "tool_calls" and replies[1]["finish_reason"] == "stop"
        assert replies[0]["tool_calls"][0]["function"]["name"] == "calc"
        assert json.loads(replies[0]["tool_calls"][0]["function"]["arguments"]) == {"x": x}
        assert replies[1]["content"] == f"answer {x}"
        recorded = [m for m in r["messages"] if m["role"] == "assistant"]
        assert recorded[0]["tool_calls"] == replies[0]["tool_calls"]
        assert recorded[1]["content"] == replies[1]["content"]
        # Tokens in, tokens out: prompt + response is exactly a full re-render of the
        # conversation with the model's own turns, and the mask is 1 on those alone.
        tokens = r["prompt_token_ids"] + r["response_token_ids"]
        mask = [0] * len(r["prompt_token_ids"]) + r["response_mask"]
        generated = _spans(tokens, mask)
        assert generated == [_call(x), f"answer {x}"]
        assert bytes(tokens).decode() == _render_sim(sent, generated)
        assert r["turns"] == 2 and r["tool_calls"] == 1


def test_edited_history_is_refused_and_recorded_as_truncated(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = scripted_pool
    out = tmp_path / "out.jsonl"

    async def main() -> None:
        async with serving(workers, out, _tasks(1), 1) as served:
            eid = (await served.episode())["id"]
            messages: list[dict[str, Any]] = [
                {"role": "user", "content": "<reply>one</reply><reply>two</reply>"}
            ]
            first, _ = await _chat(served, eid, messages, stream=False, header=True)
            assert first["content"] == "one"
            # The agent rewrites the model's reply before sending the conversation back.
            edited = [*messages, {"role": "assistant", "content": "ONE"},
                      {"role": "user", "content": "again"}]  # fmt: skip
            with pytest.raises(openai.BadRequestError) as caught:
                await _chat(served, eid, edited, stream=False, header=True)
            error = caught.value.body
            assert isinstance(error, dict) and error["code"] == "history_edited"
            assert "messages[1] (assistant) differs" in error["message"]
            await served.run

    asyncio.run(main())
    (record,) = read_records(out)
    assert record["status"] == "truncated" and record["finish_reason"] == "history_edited"
    assert "messages[1]" in record["error"] and record["turns"] == 1


def test_bad_requests_get_openai_errors_in_one_sentence(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = scripted_pool
    out = tmp_path / "out.jsonl"
    hello = [{"role": "user", "content": "<reply>hi</reply>"}]

    async def main() -> None:
        async with serving(workers, out, _tasks(1), 1) as served:
            sdk = served.client.chat.completions
            stranger = openai.AsyncOpenAI(base_url=served.url, api_key="wrong", max_retries=0)
            eid = (await served.episode())["id"]
            cases: list[tuple[type[openai.APIStatusError], str, Callable[[], Any]]] = [
                (openai.NotFoundError, "unknown_trajectory",
                 lambda: sdk.create(model=MODEL, messages=hello, user="j-t9-nope")),
                (openai.NotFoundError, "model_not_found",
                 lambda: sdk.create(model="other-job-model", messages=hello, user=eid)),
                (openai.BadRequestError, "missing_trajectory",
                 lambda: sdk.create(model=MODEL, messages=hello)),
                (openai.BadRequestError, None,
                 lambda: sdk.create(model=MODEL, messages=hello, user=eid, tools=CALC,
                                    tool_choice="required")),
                (openai.BadRequestError, None,
                 lambda: sdk.create(model=MODEL, messages=[{"role": "robot", "content": "x"}],
                                    user=eid)),
                (openai.AuthenticationError, "invalid_api_key", stranger.models.list),
            ]  # fmt: skip
            for kind, code, make in cases:
                with pytest.raises(kind) as caught:
                    await make()
                body = caught.value.body
                assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}
                assert body["code"] == code and "Traceback" not in body["message"]
                assert body["message"].count(". ") == 0, body["message"]  # one sentence
            garbled = await served.http.post(
                f"{served.url}/chat/completions", content=b"{not json",
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            assert (
                garbled.status_code == 400
                and "not valid JSON" in garbled.json()["error"]["message"]
            )
            assert (await served.http.get(f"{served.url}/nowhere")).json()["error"]["message"]
            reply, _ = await _chat(served, eid, hello, stream=False, header=True)
            assert reply["content"] == "hi"
            assert (await served.end(eid, reward="high")).json()["error"]["param"] == "reward"
            assert (await served.end(eid, reward=1)).status_code == 200
            twice = await served.end(eid)
            assert twice.status_code == 409 and twice.json()["error"]["code"] == "episode_ended"
            with pytest.raises(openai.ConflictError) as late:
                await sdk.create(model=MODEL, messages=hello, user=eid)
            assert late.value.code == "episode_ended"
            await served.run

    asyncio.run(main())
    (record,) = read_records(out)
    assert record["status"] == "done" and record["reward"] == 1.0


def test_silent_and_disconnected_agents_are_truncated_or_handed_out_again(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = scripted_pool
    out = tmp_path / "out.jsonl"
    spec = ExternalSpec(idle_timeout_s=0.5, hand_out_again=1)
    slow = "<reply>" + "x" * 4000 + "</reply>"  # a long step: time to hang up mid-call
    long_turns = SamplingSpec(max_tokens_per_turn=4000, max_total_tokens=8000)

    async def main() -> None:
        async with serving(workers, out, _tasks(2), 1, spec, sampling=long_turns) as served:
            # Episode 1: the agent takes it and never calls; handed out again, then silent
            # again: truncated (agent_timeout) after its second hand-out.
            first = (await served.episode())["id"]
            # Episode 2: the agent hangs up during its call; handed out again and finished.
            second = (await served.episode())["id"]
            hang_up = openai.AsyncOpenAI(base_url=served.url, api_key=TOKEN, max_retries=0,
                                         timeout=0.1)  # fmt: skip
            with pytest.raises(openai.APITimeoutError):
                await hang_up.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": slow}], user=second
                )
            await hang_up.close()
            again = []
            while len(again) < 2:
                ep = await served.episode()
                if ep["id"] is not None:
                    again.append(ep)
                await asyncio.sleep(0.05)
            assert {e["task"]["id"] for e in again} == {"task0", "task1"}
            assert not {e["id"] for e in again} & {first, second}  # fresh ids
            with pytest.raises(openai.ConflictError) as gone:  # the old id is not served
                await served.client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "x"}], user=second
                )
            assert "abandoned" in gone.value.message
            retry = next(e["id"] for e in again if e["task"]["id"] == "task1")
            ok = [{"role": "user", "content": "<reply>ok</reply>"}]
            reply, _ = await _chat(served, retry, ok, stream=False, header=True)
            assert reply["content"] == "ok"
            assert (await served.end(retry)).status_code == 200
            await served.run

    asyncio.run(main())
    records = {r["task_id"]: r for r in read_records(out)}
    silent, hung = records["task0"], records["task1"]
    assert silent["status"] == "truncated" and silent["finish_reason"] == "agent_timeout"
    assert "idleTimeoutSeconds" in silent["error"] and silent["episode"]["hand_outs"] == 2
    assert hung["status"] == "done" and hung["turns"] == 1 and hung["episode"]["hand_outs"] == 2
    assert hung["episode"]["abandoned"] == ["the agent disconnected during a model call"]
    assert hung["messages"][0]["content"] == "<reply>ok</reply>"  # nothing of the first try


def test_a_restarted_session_hands_out_only_what_is_not_written(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = scripted_pool
    out = tmp_path / "out.jsonl"
    tasks = _tasks(3)

    async def finish_one(served: Served) -> str:
        ep = await served.episode()
        hello = [{"role": "user", "content": "<reply>a</reply>"}]
        await _chat(served, ep["id"], hello, stream=False, header=True)
        assert (await served.end(ep["id"], reward=1)).status_code == 200
        return str(ep["task"]["id"])

    async def first() -> set[str]:
        async with serving(workers, out, tasks, 1) as served:
            done = {await finish_one(served), await finish_one(served)}
            started = await served.episode()  # taken, then the session stops under it
            while len(read_records(out)) < 2:
                await asyncio.sleep(0.02)
            assert started["task"]["id"] == "task2"
        return done

    async def second() -> tuple[str, int]:
        async with serving(workers, out, tasks, 1) as served:
            ep = await served.episode()
            assert ep["remaining"] == 1
            assert (await served.episode())["id"] is None  # nothing else to hand out
            await _chat(served, ep["id"], [{"role": "user", "content": "<reply>b</reply>"}],
                        stream=False, header=True)  # fmt: skip
            assert (await served.end(ep["id"])).status_code == 200
            await served.run
            return str(ep["task"]["id"]), 0

    assert asyncio.run(first()) == {"task0", "task1"}
    assert asyncio.run(second())[0] == "task2"
    assert_exactly_once(read_records(out), {(t.id, 0) for t in tasks})


def test_episode_ids_hold_the_trajectory() -> None:
    spec = ExternalSpec()
    env = ExternalEnvironment(spec, job="j", model=MODEL)
    ep = env.episode(Task("a", ({"role": "user", "content": "q"},)), 0, 0, "j-t000000-s000")
    env.begin()
    handed = env.hand_out()
    assert handed is ep and re.fullmatch(r"j-t000000-s000-[0-9a-f]{6}0", ep.episode_id)
    assert env.hand_out() is None and env.remaining == 1


def test_a_stream_left_mid_call_truncates_and_a_repeated_call_gets_its_reply_again(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = scripted_pool
    out = tmp_path / "out.jsonl"
    slow = "<reply>" + "x" * 4000 + "</reply>"
    long_turns = SamplingSpec(max_tokens_per_turn=4000, max_total_tokens=8000)

    async def main() -> None:
        async with serving(workers, out, _tasks(2), 1, sampling=long_turns) as served:
            # A client that repeats an answered call (a retry after a lost reply) gets
            # the same reply, and nothing is generated twice.
            first = (await served.episode())["id"]
            hello = [{"role": "user", "content": "<reply>one</reply><reply>two</reply>"}]
            once, _ = await _chat(served, first, hello, stream=False, header=True)
            again, _ = await _chat(served, first, hello, stream=True, header=False)
            assert once["content"] == again["content"] == "one"
            assert (await served.end(first)).status_code == 200
            # A streaming client that goes away after the first chunk abandons its episode.
            second = (await served.episode())["id"]
            body = {"model": MODEL, "stream": True, "user": second,
                    "messages": [{"role": "user", "content": slow}]}  # fmt: skip
            async with served.http.stream("POST", f"{served.url}/chat/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    assert json.loads(line.removeprefix("data: "))["choices"][0]["delta"] == {
                        "role": "assistant",
                        "content": "",
                    }
                    break  # leave mid-stream: the connection closes
            await served.run

    asyncio.run(main())
    records = {r["task_id"]: r for r in read_records(out)}
    assert records["task0"]["status"] == "done" and records["task0"]["turns"] == 1
    left = records["task1"]
    assert left["status"] == "truncated" and left["finish_reason"] == "agent_disconnected"


def test_an_episode_kept_past_its_timeout_is_truncated_naming_the_limit(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = scripted_pool
    out = tmp_path / "out.jsonl"
    spec = ExternalSpec(idle_timeout_s=30, episode_timeout_s=0.5)

    async def main() -> None:
        async with serving(workers, out, _tasks(1), 1, spec) as served:
            eid = (await served.episode())["id"]
            hello = [{"role": "user", "content": "<reply>one</reply>"}]
            await _chat(served, eid, hello, stream=False, header=True)
            await served.run  # the agent keeps thinking; the episode's time runs out
            late = await served.end(eid, reward=1)
            assert late.status_code == 409 and late.json()["error"]["code"] == "episode_ended"

    asyncio.run(main())
    (record,) = read_records(out)
    assert (record["status"], record["finish_reason"]) == ("truncated", "agent_timeout")
    assert "past 0.5 s (episodeTimeoutSeconds)" in record["error"] and record["turns"] == 1


def test_a_trajectory_migrates_while_its_agent_thinks_and_stays_token_exact(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = scripted_pool
    out = tmp_path / "out.jsonl"

    async def main() -> str:
        async with serving(workers, out, _tasks(1), 1) as served:
            eid = (await served.episode())["id"]
            messages: list[dict[str, Any]] = [
                {"role": "user", "content": "<reply>one</reply><reply>two</reply>"}
            ]
            reply, _ = await _chat(served, eid, messages, stream=False, header=True)
            run = served.session.runs[served.env.lookup(eid).trajectory_id]
            source = run.resident
            assert source is not None
            # The agent is busy between calls (its tool time): the worker holding the
            # context drains, so the session moves it to the other one meanwhile.
            served.session.drain_worker(source)
            for _ in range(200):
                if run.migrations:
                    break
                await asyncio.sleep(0.05)
            messages += [reply, {"role": "user", "content": "next"}]
            second, _ = await _chat(served, eid, messages, stream=True, header=True)
            assert second["content"] == "two"
            assert (await served.end(eid)).status_code == 200
            await served.run
            return source

    source = asyncio.run(main())
    (record,) = read_records(out)
    (move,) = record["placement"]["migrations"]
    assert move["from"] == source and move["after_turn"] == 1
    assert record["placement"]["steps"] == [source, move["to"]] and move["to"] != source
    tokens = bytes(record["prompt_token_ids"] + record["response_token_ids"]).decode()
    assert tokens == (
        "<|user|>\n<reply>one</reply><reply>two</reply>\n<|assistant|>\none\n"
        "<|user|>\nnext\n<|assistant|>\ntwo"
    )


def test_records_for_trainers_mark_an_episode_without_a_model_call_and_a_cut_last_turn(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    """Ended with no model call: failed (no_model_call), reward null, the agent's reward kept
    aside, so an export makes it a placeholder. A last turn cut by maxTokensPerTurn: the
    record says length (truncated), not stop."""
    _, workers = scripted_pool
    out = tmp_path / "out.jsonl"
    sampling = SamplingSpec(max_tokens_per_turn=8, max_total_tokens=4000)

    async def main() -> None:
        async with serving(workers, out, _tasks(2), 1, sampling=sampling) as served:
            first, second = await served.episode(), await served.episode()
            ended = await served.end(first["id"], reward=1.0, info={"why": "gave up"})
            assert ended.status_code == 200, ended.text
            messages = [{"role": "user", "content": "<reply>a reply far longer than 8</reply>"}]
            reply, finish = await _chat(served, second["id"], messages, stream=False, header=True)
            assert finish == "length" and reply["content"] == "a reply "
            assert (await served.end(second["id"], reward=0.5)).status_code == 200
            await served.run

    asyncio.run(main())
    by_task = {r["task_id"]: r for r in read_records(out)}
    silent = by_task["task0"] if by_task["task0"]["turns"] == 0 else by_task["task1"]
    cut = by_task["task1"] if silent is by_task["task0"] else by_task["task0"]
    assert (silent["status"], silent["finish_reason"]) == ("failed", "no_model_call")
    assert silent["reward"] is None and silent["response_token_ids"] == []
    assert silent["reward_info"] == {"agent_reward": 1.0, "agent_info": {"why": "gave up"}}
    assert (cut["status"], cut["finish_reason"], cut["reward"]) == ("truncated", "length", 0.5)
