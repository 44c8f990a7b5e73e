"""The ``external`` environment: agents outside Heddle drive the loop through the gateway.

An agent (any framework that speaks OpenAI's chat API) takes an episode from
the gateway (``_gateway.py``), makes its model calls with the episode's id
and ends it. Each call is one step of that episode's trajectory under the
session's scheduling: :meth:`ExternalEpisode.opening` waits for the first
call (its messages are the prompt), :meth:`ExternalEpisode.after_turn` hands
the model's reply to the waiting request and waits for the next call or the
end. That wait is the trajectory's tool time, during which the session may
migrate it, exactly as for its own tools.

Tokens in, tokens out: the session keeps the token history and each call
appends only the messages it adds behind what the model has already seen (the
worker renders that delta), so the record is what the model saw and
generated. A call whose earlier messages differ from that history (an agent
that edits or drops them) is refused and its trajectory written as truncated
(``history_edited``), never silently re-tokenised.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from heddle.api import ExternalSpec

from ._environments import Environment, Episode, Outcome, ParsedCalls
from ._gateway_messages import (
    ChatCall,
    ChatReply,
    GatewayError,
    all_same,
    first_difference,
    normal_message,
    openai_call,
    stored_reply,
)
from ._output_record import TrajectoryStatus
from ._tasks import Task
from ._tools import HermesParser

__all__ = [
    "ChatCall",
    "ChatReply",
    "ExternalEnvironment",
    "ExternalEpisode",
    "GatewayError",
    "normal_message",
]


@dataclass(frozen=True)
class _Event:
    kind: str  # call, end, abandon, finish
    call: ChatCall | None = None
    reward: float | None = None
    info: Mapping[str, Any] | None = None
    reason: str = ""  # abandon, finish: the record's finish_reason
    error: str = ""  # ... and the sentence saying why


@dataclass(eq=False)
class ExternalEpisode(Episode):
    env: ExternalEnvironment | None = None
    task_index: int = 0
    episode_id: str = ""  # this hand-out's id, what the agent sends
    hand_outs: int = 0
    state: str = "queued"  # queued, idle (the agent's turn), busy (a call runs), ended, finished
    history: list[dict[str, Any]] = field(default_factory=list)  # what the model has seen
    current: ChatCall | None = None
    abandoned: list[str] = field(default_factory=list)  # why earlier hand-outs were given up
    _usage: tuple[int, int] = (0, 0)
    _last: tuple[list[dict[str, Any]], ChatReply] | None = None  # the last answered call
    _events: asyncio.Queue[_Event] = field(default_factory=asyncio.Queue)
    _handed: asyncio.Event = field(default_factory=asyncio.Event)
    _deadline: float | None = None  # monotonic end of this hand-out (episodeTimeoutSeconds)

    @property
    def spec(self) -> ExternalSpec:
        assert self.env is not None
        return self.env.spec

    # -- the gateway's side ------------------------------------------------------------
    def hand_out(self, episode_id: str) -> None:
        self.episode_id, self.state = episode_id, "idle"
        self.hand_outs += 1
        self.history, self.current, self._last = [], None, None
        self._events = asyncio.Queue()  # nothing sent under an earlier hand-out's id counts
        timeout = self.spec.episode_timeout_s
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._handed.set()

    def submit(self, call: ChatCall) -> ChatReply | None:
        """Queue a call for the session; a repeat of the last answered call gets its reply."""
        self._check_open()
        if self.state == "busy":
            raise GatewayError(
                409,
                f"a model call of episode {self.episode_id} is already under way; an "
                "episode's calls are sequential (wait for the reply, then call again)",
                code="call_in_progress",
            )
        if self.history:
            if self._last is not None and all_same(call.messages, self._last[0]):
                return self._last[1]  # a client's retry of a call that was answered
            edit = first_difference(self.history, call.messages)
            if edit is not None:
                self.state = "ended"
                self._events.put_nowait(_Event("finish", reason="history_edited", error=edit))
                raise GatewayError(
                    400,
                    f"{edit}; the episode is recorded as truncated (history_edited). Send "
                    "the conversation as the model saw it, replies unchanged, and append only",
                    code="history_edited",
                    param="messages",
                )
        self.state = "busy"
        self.current = call
        self._events.put_nowait(_Event("call", call=call))
        return None

    def end(self, reward: float | None, info: Mapping[str, Any] | None) -> None:
        self._check_open()
        if self.state == "busy":
            raise GatewayError(
                409,
                f"a model call of episode {self.episode_id} is under way; end the episode "
                "once it has returned",
                code="call_in_progress",
            )
        self.state = "ended"
        self._events.put_nowait(_Event("end", reward=reward, info=info))

    def disconnected(self, call: ChatCall) -> None:
        """The agent left before the call's reply: the episode is abandoned after the step."""
        call.gone = True

    def _check_open(self) -> None:
        if self.state in ("ended", "finished"):
            raise GatewayError(
                409,
                f"episode {self.episode_id} has already ended; take another with POST /v1/episodes",
                code="episode_ended",
            )

    # -- the session's side ------------------------------------------------------------
    def turn_limit(self, turn: int, default: int) -> tuple[int, bool]:
        asked = self.current.max_tokens if self.current is not None else None
        return (default if asked is None else min(default, asked)), False

    def chat_tools(self) -> tuple[Sequence[Mapping[str, Any]], str | None]:
        call = self.current
        if call is None or not call.tools:
            return (), None
        return call.tools, (None if call.tool_choice == "none" else self.spec.tool_parser)

    def note_step(self, prompt_tokens: int, completion_tokens: int) -> None:
        self._usage = (prompt_tokens, completion_tokens)

    async def opening(self) -> Outcome | None:
        while True:
            await self._handed.wait()
            event = await self._next()
            if event.kind == "call":
                assert event.call is not None
                self.history = list(event.call.messages)
                return Outcome(messages=tuple(event.call.messages))
            outcome = self._ending(event, None)
            if not outcome.restart:
                return outcome

    async def after_turn(
        self, turn: int, text: str, finish_reason: str, parsed: ParsedCalls | None = None
    ) -> Outcome:
        call = self.current
        assert call is not None
        message, reason = self._assistant(text, finish_reason, parsed, call)
        reply = ChatReply(message, reason, *self._usage)
        self.history.append(stored_reply(message))
        self._last = (call.messages, reply)
        self.current = None
        if self.state == "busy":
            self.state = "idle"
        if call.gone:
            event = _Event(
                "abandon",
                reason="agent_disconnected",
                error="the agent disconnected during a model call",
            )
        else:
            if not call.reply.done():
                call.reply.set_result(reply)
            started = time.monotonic()
            event = await self._next()
            waited = time.monotonic() - started
            self.tool_seconds += waited
            if self.env is not None and event.kind == "call":
                self.env.note_gap(waited)
        if self.env is not None:
            self.expected_tool_s = self.env.expected_gap_s()
        names = tuple(c["function"]["name"] for c in message.get("tool_calls") or ())
        if event.kind != "call":
            outcome = self._ending(event, reason)
            return Outcome(
                done=outcome.done,
                status=outcome.status,
                finish_reason=outcome.finish_reason,
                error=outcome.error,
                reward=outcome.reward,
                reward_info=outcome.reward_info,
                restart=outcome.restart,
                tool_calls=names,
                assistant=message,
            )
        assert event.call is not None
        new = event.call.messages[len(self.history) :]
        self.history = list(event.call.messages)
        return Outcome(messages=tuple(new), tool_calls=names, assistant=message)

    def _ending(self, event: _Event, last_reason: str | None) -> Outcome:
        """The outcome of an event other than a call; ``last_reason`` is the last turn's
        finish reason (None: the model was never called)."""
        if event.kind == "end" and last_reason is None:
            # Nothing the model generated: a trainer must not take the agent's reward as a
            # sample's (docs/gateway.md, "Records for trainers"). Failed: a placeholder row.
            return Outcome(done=True, status=TrajectoryStatus.FAILED,
                           finish_reason="no_model_call",
                           error="the agent ended the episode before any model call, so it "
                                 "holds no tokens to train on",
                           reward_info={"agent_reward": event.reward,
                                        "agent_info": dict(event.info or {})})  # fmt: skip
        if event.kind == "end" and last_reason == "length":
            # The last turn was cut by maxTokensPerTurn: the record says so, as vLLM would.
            return Outcome(done=True, status=TrajectoryStatus.TRUNCATED, finish_reason="length",
                           reward=event.reward, reward_info=event.info)  # fmt: skip
        if event.kind == "end":
            return Outcome(done=True, finish_reason="stop", reward=event.reward,
                           reward_info=event.info)  # fmt: skip
        if event.kind == "finish":
            return Outcome(done=True, status=TrajectoryStatus.TRUNCATED, finish_reason=event.reason,
                           error=event.error)  # fmt: skip
        # abandoned by its agent: hand it out afresh if the job allows, else write it
        assert self.env is not None
        self.env.retire(
            self.episode_id,
            f"episode {self.episode_id} was abandoned ({event.error}) and is no longer served",
        )
        if self.hand_outs <= self.spec.hand_out_again:
            self.abandoned.append(event.error)
            self.state, self.tool_seconds = "queued", 0.0
            self._handed.clear()
            self._fail_current(event.error)
            self.env.requeue(self)
            return Outcome(restart=True)
        self.state = "ended"
        return Outcome(done=True, status=TrajectoryStatus.TRUNCATED, finish_reason=event.reason,
                       error=event.error)  # fmt: skip

    async def _next(self) -> _Event:
        """The agent's next call or end; an abandonment once it stays silent too long."""
        timeout = self.spec.idle_timeout_s
        kind = "idleTimeoutSeconds"
        if self._deadline is not None and self._deadline - time.monotonic() < timeout:
            timeout, kind = max(0.0, self._deadline - time.monotonic()), "episodeTimeoutSeconds"
        try:
            return await asyncio.wait_for(self._events.get(), timeout)
        except TimeoutError:
            limit = self.spec.idle_timeout_s
            if kind == "episodeTimeoutSeconds":
                limit = self.spec.episode_timeout_s or 0.0
                what = f"the agent kept the episode past {limit:g} s ({kind})"
            else:
                what = f"the agent sent nothing for {limit:g} s ({kind})"
            return _Event("abandon", reason="agent_timeout", error=what)

    def _assistant(
        self, text: str, finish_reason: str, parsed: ParsedCalls | None, call: ChatCall
    ) -> tuple[dict[str, Any], str]:
        """The turn as OpenAI's assistant message, and its finish reason."""
        reason = "stop" if finish_reason == "stop" else "length"
        content, calls = text, []
        if call.tools and call.tool_choice != "none":
            if parsed is not None:
                content, calls = parsed.content, [dict(c) for c in parsed.calls]
            else:  # an engine without vLLM's parsers (sim): Hermes tags
                found, errors = HermesParser().parse(text)
                if found and not errors:
                    content = HermesParser().content(text)
                    calls = [openai_call(c.openai(), "reply") for c in found]
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            for i, c in enumerate(calls):
                c["id"] = c.get("id") or f"call_{secrets.token_hex(8)}_{i}"
            message["tool_calls"] = calls
            message["content"] = content if content.strip() else None
            reason = "tool_calls"
        return message, reason

    def _fail_current(self, why: str) -> None:
        call = self.current
        self.current = None
        if call is not None and not call.reply.done():
            call.reply.set_exception(GatewayError(409, why, code="episode_ended"))

    def finished(self, status: TrajectoryStatus, finish_reason: str) -> None:
        queued, self.state = self.state == "queued", "finished"
        why = f"episode {self.episode_id} has ended ({status}: {finish_reason})"
        self._fail_current(why)
        if self.env is not None:
            self.env.done(self, why, queued=queued)

    def episode_record(self) -> dict[str, Any] | None:
        return {
            "id": self.episode_id,
            "hand_outs": self.hand_outs,
            "abandoned": list(self.abandoned),
        }


class ExternalEnvironment(Environment):
    """Episodes handed out to outside agents; see the module docstring."""

    name = "external"

    def __init__(
        self, spec: ExternalSpec, *, job: str, model: str, token: str | None = None
    ) -> None:
        self.spec, self.job, self.model = spec, job, model
        self.token = token or secrets.token_urlsafe(24)
        self._nonce = secrets.token_hex(3)  # ids of an earlier session are never served
        self._queue: deque[ExternalEpisode] = deque()
        self._live: dict[str, ExternalEpisode] = {}
        self._retired: dict[str, str] = {}  # ids no longer served -> why
        self._unfinished = 0
        self._group_size = 1
        self.started = asyncio.Event()
        self.closed = False
        self._gaps = (0.0, 0)  # the agents' time between a reply and their next call

    def episode(self, task: Task, task_index: int, sample: int, trajectory_id: str) -> Episode:
        ep = ExternalEpisode(task, sample, trajectory_id, env=self, task_index=task_index)
        self._group_size = max(self._group_size, sample + 1)
        self._queue.append(ep)  # task order, then sample: GRPO siblings go out together
        self._unfinished += 1
        return ep

    def begin(self) -> None:
        self.started.set()

    @property
    def remaining(self) -> int:
        """Episodes not written yet (queued or with an agent)."""
        return self._unfinished

    def hand_out(self) -> ExternalEpisode | None:
        if self.closed or not self._queue:
            return None
        ep = self._queue.popleft()
        ep.hand_out(f"{ep.trajectory_id}-{self._nonce}{ep.hand_outs}")
        self._live[ep.episode_id] = ep
        return ep

    def lookup(self, episode_id: str) -> ExternalEpisode:
        ep = self._live.get(episode_id)
        if ep is not None:
            return ep
        why = self._retired.get(episode_id)
        if why is not None:
            raise GatewayError(409, f"{why}; take another with POST /v1/episodes",
                               code="episode_ended")  # fmt: skip
        raise GatewayError(
            404,
            f"unknown trajectory id {episode_id!r}: this job ({self.job}) never handed it out "
            "in this session; take an episode with POST /v1/episodes and send its id",
            code="unknown_trajectory",
        )

    def retire(self, episode_id: str, why: str) -> None:
        if self._live.pop(episode_id, None) is not None:
            self._retired[episode_id] = why

    def requeue(self, ep: ExternalEpisode) -> None:
        self._queue.appendleft(ep)  # first in line: its siblings are running now

    def done(self, ep: ExternalEpisode, why: str, *, queued: bool) -> None:
        if ep.episode_id:
            self.retire(ep.episode_id, why)
        if queued and ep in self._queue:  # written unstarted (the deadline): never hand it out
            self._queue.remove(ep)
        self._unfinished -= 1

    def note_gap(self, seconds: float) -> None:
        total, count = self._gaps
        self._gaps = (total + seconds, count + 1)

    def expected_gap_s(self) -> float:
        total, count = self._gaps
        return total / count if count else 0.0

    @property
    def group_size(self) -> int:
        return self._group_size

    async def close(self) -> None:
        """The session stops: calls still waiting are answered with an error."""
        self.closed = True
        for ep in list(self._live.values()):
            ep._fail_current(f"the session of job {self.job} stopped")
