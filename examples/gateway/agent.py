"""An agent that owns its loop and talks to the model through the OpenAI SDK.

It runs the episodes of a Heddle ``external`` job (docs/gateway.md): take an
episode, call the model with the episode's id in the ``X-Heddle-Trajectory``
header, run the tools it asks for (here a local ``add``), end the episode with
a reward. Any framework that lets you set the base URL, the API key and one
header (or the ``user`` field) works the same way.

    python examples/gateway/agent.py --gateway examples/gateway/out/rollout.jsonl.gateway.json

``--gateway`` is the file ``heddle run`` writes with the URL and token; it is
waited for, so the agent may start before the job. ``--base-url`` and
``--api-key`` (or OPENAI_BASE_URL / OPENAI_API_KEY) give them directly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Adds two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def run_tool(name: str, arguments: str) -> str:
    """The agent's own tools; a bad call gets an error message, as most frameworks do."""
    try:
        args = json.loads(arguments)
        if name == "add":
            return str(int(args["a"]) + int(args["b"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc}"
    return f"error: unknown tool {name!r}"


def score(answer: str | None, expected: Any) -> float:
    numbers = re.findall(r"-?\d+", answer or "")
    return 1.0 if expected is not None and numbers and numbers[-1] == str(expected) else 0.0


async def run_episode(
    http: httpx.AsyncClient, client: openai.AsyncOpenAI, model: str, episode: dict[str, Any]
) -> float:
    """One episode: model calls and tool calls until an answer, then the end with a reward."""
    eid = episode["id"]
    messages: list[Any] = list(episode["task"]["messages"])
    reward, turns = 0.0, 0
    try:
        while turns < 4:  # the job's maxTurns
            turns += 1
            reply = await client.chat.completions.create(
                model=model,
                messages=messages,
                tools=[ADD],  # type: ignore[list-item]
                extra_headers={"X-Heddle-Trajectory": eid},
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))  # sent back unchanged
            if not message.tool_calls:
                reward = score(message.content, episode["task"]["metadata"].get("answer"))
                break
            for call in message.tool_calls:
                result = run_tool(call.function.name, call.function.arguments)  # type: ignore[union-attr]
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    except openai.APIStatusError as exc:
        # The session ended the episode itself (maxTurns, token limits, deadline):
        # its record is written already; nothing to end.
        if exc.code == "episode_ended":
            return 0.0
        raise
    ended = await http.post(
        f"episodes/{eid}/end", json={"reward": reward, "info": {"agent_turns": turns}}
    )
    if ended.status_code != 200 and ended.json()["error"]["code"] != "episode_ended":
        ended.raise_for_status()
    return reward


async def worker(http: httpx.AsyncClient, client: openai.AsyncOpenAI, model: str) -> list[float]:
    rewards = []
    while True:
        try:
            episode = (await http.post("episodes")).raise_for_status().json()
        except httpx.ConnectError:
            if rewards:
                return rewards  # the job ended and its gateway went while we worked
            raise
        if episode["id"] is None:
            if episode["remaining"] == 0:
                return rewards
            await asyncio.sleep(0.2)  # all handed out; one may come back (handOutAgain)
            continue
        rewards.append(await run_episode(http, client, model, episode))


def gateway_from_file(path: Path, wait_s: float) -> tuple[str, str]:
    deadline = time.monotonic() + wait_s
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"agent: no gateway file {path} after {wait_s:g} s; is `heddle run` running?")
        time.sleep(0.5)
    data = json.loads(path.read_text())
    return data["url"], data["token"]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", type=Path, help="the .gateway.json `heddle run` writes")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    parser.add_argument("--concurrency", type=int, default=8, help="episodes run at once")
    parser.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the job")
    args = parser.parse_args()
    if args.gateway is not None:
        base_url, api_key = gateway_from_file(args.gateway, args.wait)
    elif args.base_url and args.api_key:
        base_url, api_key = args.base_url, args.api_key
    else:
        sys.exit("agent: give --gateway FILE, or --base-url and --api-key")
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=base_url + "/", headers=headers, timeout=600) as http:
        model = (await client.models.list()).data[0].id
        done = await asyncio.gather(*(worker(http, client, model) for _ in range(args.concurrency)))
    rewards = [r for rs in done for r in rs]
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    print(f"agent: {len(rewards)} episodes, mean reward {mean:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
