"""The drafter replayed over a real run's tokens: what each trajectory's steps would have
accepted, predicted from its text rather than copied from the workers' counts.

With drafts that carry no probabilities (vLLM's ``suffix`` and ``ngram``) a draft
token is accepted iff it equals the token the target model sampled, so replaying
the recorded output against the same drafter gives the tokens each decode step
produced (docs/speculation.md, "Drafters replayed exactly"). A live engine's
suffix cache is global: it holds every response the engine served (the bench's
warm-up and earlier runs included, up to vLLM's 10,000 requests) and the running
requests' tokens as they are generated. :func:`replay_engines` rebuilds that from
the token traces of the runs, in the order they ran:

* each step is one request on the engine its trace names; its own tree holds the
  context it was sent (prompt, earlier turns, tool replies) and its response;
* the engine's tree receives every request's tokens as the replay produces them;
  a request's tokens are taken to appear at an even pace between its start in
  the engine (after its queue) and its end, so requests running side by side
  draft from each other's text as far as it existed (the one approximation:
  the real interleaving within a request is not recorded);
* K per step comes from the workers' setting: fixed, or by the number of
  requests running on that engine at that moment (their batch-size table).

Not replayed: texts Heddle's session inserted into the engines' trees
(``POST /v1/drafts``), which no trace records; for Heddle's runs the replay
therefore drafts from less than the engine held.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from heddle.scheduler import (
    SUFFIX_DEFAULTS,
    SuffixDrafter,
    SuffixIndex,
    accepted_prefix,
    ngram_draft,
)

__all__ = [
    "ReplayedRequest",
    "StepTokens",
    "k_for_batch",
    "measured",
    "replay_engines",
    "requests_of",
]


@dataclass(frozen=True)
class ReplayedRequest:
    """One step of a trajectory as an engine served it."""

    run: str  # the run it belongs to (its output's name)
    trajectory: str
    engine: str
    context: tuple[int, ...]  # what the step was sent: the whole conversation so far
    output: tuple[int, ...]  # the tokens it generated
    start_s: float  # in the engine, after its queue (wall clock)
    end_s: float


@dataclass
class StepTokens:
    """A trajectory's replayed (or measured) tokens and the accepted drafts among them."""

    tokens: int = 0
    accepted: int = 0
    requests: int = 0  # its steps: each one's first token came from its prefill

    @property
    def tokens_per_step(self) -> float:
        """Tokens per engine step, as the worker counts them: tokens over steps that
        produced them (tokens less accepted drafts; the prefill's token is one)."""
        steps = self.tokens - self.accepted
        return self.tokens / steps if steps > 0 else 1.0

    @property
    def decode_tokens_per_step(self) -> float:
        """The same over decode steps only (the prefills' tokens left out): what the
        simulator's decode iterations advance by (it times prefills apart)."""
        steps = self.tokens - self.accepted - self.requests
        return (self.tokens - self.requests) / steps if steps > 0 else 1.0

    def add(self, other: StepTokens) -> None:
        self.tokens += other.tokens
        self.accepted += other.accepted
        self.requests += other.requests


def k_for_batch(k: int, table: Sequence[tuple[int, int, int]] = ()) -> Callable[[int], int]:
    """The workers' K: ``k`` fixed, or from their ``(first, last, K)`` batch-size table."""

    def choose(batch: int) -> int:
        for first, last, kk in table:
            if first <= batch <= last:
                return kk
        return table[-1][2] if table else k

    return choose


def _trajectory_id(line: Mapping[str, Any]) -> str:
    return str(line["trajectory_id"])


def requests_of(
    run: str,
    trace_lines: Iterable[Mapping[str, Any]],
    key: Callable[[Mapping[str, Any]], str] = _trajectory_id,
) -> list[ReplayedRequest]:
    """The steps of one run's token trace (``heddle run --trace``'s lines) as requests,
    each trajectory named by ``key`` of its line (default: its id)."""
    out: list[ReplayedRequest] = []
    for line in trace_lines:
        context: list[int] = []
        for step in line.get("steps") or ():
            context.extend(step["input_token_ids"])
            output = tuple(step["output_token_ids"])
            total, engine_s = float(step["total_s"]), float(step["engine_s"])
            # The engine's time is the end of the worker's call: queue, prefill, decode.
            start = float(step["started_at"]) + max(0.0, total - engine_s) + float(step["queue_s"])
            end = float(step["started_at"]) + total
            out.append(
                ReplayedRequest(
                    run, key(line), str(step["worker"]), tuple(context),
                    output, start, max(start, end),
                )
            )  # fmt: skip
            context.extend(output)
    return out


@dataclass
class _Live:
    req: ReplayedRequest
    drafter: SuffixDrafter
    context: list[int]
    pos: int = 0
    pending: tuple[int, ...] = ()
    accepted: int = 0
    started: bool = False
    key: int = 0
    emitted: list[int] = field(default_factory=list)

    def at(self, pos: int) -> float:
        """When the request's ``pos``-th token appears (an even pace over its window)."""
        r = self.req
        return r.start_s + (r.end_s - r.start_s) * pos / max(1, len(r.output))


def replay_engines(
    requests: Sequence[ReplayedRequest],
    method: str,
    k_of_batch: Callable[[int], int],
    *,
    ngram: tuple[int, int] = (5, 5),
) -> dict[str, dict[str, StepTokens]]:
    """Per run, per trajectory: the tokens and accepted drafts the replay gives (module doc).

    ``requests``: every request the engines served, the runs in the order they ran
    (warm-up first: an engine's tree outlives a run).
    """
    by_engine: dict[str, list[ReplayedRequest]] = defaultdict(list)
    for r in requests:
        by_engine[r.engine].append(r)
    out: dict[str, dict[str, StepTokens]] = defaultdict(lambda: defaultdict(StepTokens))
    for reqs in by_engine.values():
        shared = SuffixIndex(SUFFIX_DEFAULTS.max_tree_depth)
        heap: list[tuple[float, int, _Live]] = []
        for i, r in enumerate(reqs):
            live = _Live(r, SuffixDrafter(r.context, shared), list(r.context), key=i)
            heapq.heappush(heap, (r.start_s, i, live))
        running: set[int] = set()
        while heap:
            now, _, live = heapq.heappop(heap)
            req = live.req
            if not live.started:  # its prefill samples the first token
                live.started = True
                running.add(live.key)
                live.pending, live.pos = req.output[:1], min(1, len(req.output))
            else:
                new, live.pending = live.pending, ()
                if new:
                    live.drafter.append(new)
                    live.context.extend(new)
                    shared.extend(live.key, new)
                if live.pos >= len(req.output):
                    running.discard(live.key)
                    tally = out[req.run][req.trajectory]
                    tally.add(StepTokens(len(req.output), live.accepted, 1 if req.output else 0))
                    continue
                k = k_of_batch(len(running))
                draft: Sequence[int] = ()
                if k > 0 and method == "ngram":
                    draft = ngram_draft(live.context, k, *ngram)
                elif k > 0:
                    draft = live.drafter.propose(k).token_ids
                hit = accepted_prefix(draft, req.output[live.pos : live.pos + len(draft)])
                emit = min(hit + 1, len(req.output) - live.pos)
                live.accepted += emit - 1
                live.pending = req.output[live.pos : live.pos + emit]
                live.pos += emit
                live.emitted.append(emit)
            heapq.heappush(heap, (max(now, live.at(live.pos)), live.key, live))
    return {run: dict(per) for run, per in out.items()}


def measured(
    records: Iterable[Mapping[str, Any]],
    key: Callable[[Mapping[str, Any]], str] = _trajectory_id,
) -> dict[str, StepTokens]:
    """Per trajectory, what its workers counted (the output record's ``speculation``)."""
    got: dict[str, StepTokens] = {}
    for rec in records:
        spec = rec.get("speculation")
        if spec:
            tokens = int(rec["tokens"]["generated"])
            got[key(rec)] = StepTokens(tokens, int(spec["accepted_tokens"]), int(rec["turns"]))
    return got
