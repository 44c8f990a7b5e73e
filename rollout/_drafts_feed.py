"""The live drafting corpus: the texts each engine's suffix cache lacks, sent as they appear.

vLLM's suffix decoding drafts from a tree per engine over the responses that engine
served. A trajectory's GRPO siblings that ran on *another* engine, and the same
task's outputs in earlier iterations, are texts its engine lacks; the session has
them all. :class:`DraftsFeed` sends them (``POST /v1/drafts``, docs/worker-api.md):

* **Siblings, finished and in progress.** Each finished step's generated tokens are
  one text (as vLLM itself keeps one response per request: a multi-turn
  trajectory's turns are separate responses). When a step of task T finishes on
  engine A, its text goes to every other engine that has run a step of T in this
  job; an engine that takes its first step of T gets every text of T it lacks.
  Only the new turn travels (deltas), never a whole trajectory again; a text never
  goes to the engine that produced it.
* **History** (:class:`DraftCorpus`): finished trajectories' texts per task id,
  across jobs — the task's earlier iterations. Bounded: ``per_task`` trajectories
  per task id (newest kept), ``max_tasks`` task ids (least recently used
  forgotten), each text cut to ``max_text_tokens``. It lives with the process that
  owns the pool's sessions (:func:`pool_corpus`, one per pool name): a trainer's
  in-process loop keeps it from one iteration's job to the next.

Traffic is bounded (at most ``max_texts_per_engine_task`` texts per engine and task,
the worker's own bound; at most ``max_queued_texts`` waiting; ``batch_texts`` per
call) and never blocks the control loop: the session's hooks only queue, one
background task sends, and a failed call is logged and counted, never raised (its
texts are offered again the next time a step of that task goes to that engine).
Only for pools whose speculation method is ``suffix`` or ``auto``; an engine whose
``/v1/state`` says it does not run suffix decoding (``auto`` without arctic-inference)
gets nothing.

With a :class:`SeedGate` (the session's, rollout/_run.py), each insertion is decided
as the simulator decides it (:func:`heddle.scheduler.seed_text_pays`, rollout/_seed_gate.py):
a text that would cost its engine more than it saves is not sent, and counted
(``texts_refused``). A refused sibling is offered again with its next turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from heddle.exceptions import HeddleError
from heddle.scheduler import Trajectory, unseeded_history

from ._seed_gate import SeedGate

__all__ = [
    "DRAFTING_METHODS",
    "DraftCorpus",
    "DraftText",
    "DraftsFeed",
    "DraftsFeedConfig",
    "pool_corpus",
]

log = logging.getLogger("heddle.session.drafts")

DRAFTING_METHODS: Final = ("suffix", "auto")  # methods whose engines draft from other texts
# How old an engine's /v1/state may be when the seed gate reads its K table (an auto
# engine rebuilds it from the acceptance it measures; one read costs the engine a
# collective_rpc between steps).
STATE_REFRESH_S: Final = 10.0


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


class TrackedRun(Protocol):
    """What the gate reads of a session's trajectory (rollout/_record.py, TrajectoryRun)."""

    @property
    def traj(self) -> Trajectory: ...

    @property
    def task(self) -> _HasId: ...


class SeedsDrafts(Protocol):
    """What the feed needs of a worker client (heddle.worker.WorkerClient)."""

    async def seed_drafts(
        self, job: str, task_id: str, texts: Sequence[Sequence[int]], *, timeout: float = ...
    ) -> int: ...

    async def state(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class DraftsFeedConfig:
    """Bounds of the feed; times in seconds."""

    max_text_tokens: int = 4096  # a longer text is cut to its first tokens
    max_texts_per_engine_task: int = 64  # the worker's MAX_DRAFT_TEXTS_PER_TASK
    max_queued_texts: int = 4096  # waiting to be sent, all engines; more are dropped (counted)
    batch_texts: int = 32  # texts per POST /v1/drafts
    timeout_s: float = 10.0  # per call


@dataclass(frozen=True)
class DraftText:
    """One response: a step's generated tokens. ``origin``: the engine that produced it
    (it holds the text already); ``job``: the RolloutJob it came from."""

    key: str
    tokens: array[int]  # 4 bytes a token (a list of ints costs about 36)
    origin: str | None
    job: str
    trajectory: str = ""  # the trajectory whose step made it (a sibling's texts go together)


@dataclass
class DraftCorpus:
    """Finished trajectories' texts per task id, across jobs (the history), bounded."""

    per_task: int = 16  # trajectories per task id, newest kept
    max_tasks: int = 4096  # task ids, least recently used forgotten
    _tasks: OrderedDict[str, deque[tuple[DraftText, ...]]] = field(default_factory=OrderedDict)

    def add(self, task_id: str, texts: Sequence[DraftText]) -> None:
        """One finished trajectory's texts."""
        if not texts:
            return
        held = self._tasks.get(task_id)
        if held is None:
            held = self._tasks[task_id] = deque(maxlen=self.per_task)
        self._tasks.move_to_end(task_id)
        held.append(tuple(texts))
        while len(self._tasks) > self.max_tasks:
            self._tasks.popitem(last=False)

    def texts(self, task_id: str, *, not_job: str | None = None) -> list[DraftText]:
        """The task's texts, newest trajectory first; ``not_job``'s left out (its own
        siblings reach the engines as the job runs)."""
        held = self._tasks.get(task_id)
        if held is None:
            return []
        self._tasks.move_to_end(task_id)
        return [t for run in reversed(held) for t in run if t.job != not_job]

    def trajectories(self, task_id: str) -> int:
        return len(self._tasks.get(task_id, ()))

    def __len__(self) -> int:
        return len(self._tasks)


_CORPORA: dict[str, DraftCorpus] = {}


def pool_corpus(pool: str) -> DraftCorpus:
    """The history of pool ``pool`` in this process (made on first use)."""
    corpus = _CORPORA.get(pool)
    if corpus is None:
        corpus = _CORPORA[pool] = DraftCorpus()
    return corpus


@dataclass
class FeedStats:
    texts_sent: int = 0  # texts delivered in calls that succeeded
    tokens_sent: int = 0
    texts_seeded: int = 0  # of those, inserted by the engines (the rest: already held)
    calls: int = 0
    errors: int = 0  # calls that failed (logged, never raised)
    texts_failed: int = 0  # texts of the calls that failed (offered again later)
    texts_refused: int = 0  # texts the seed gate found not paying (never sent)
    tokens_refused: int = 0
    dropped: int = 0  # texts not queued: the queue or the per-engine-task bound was full

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class DraftsFeed:
    """Sends each engine the texts of its trajectories' tasks it lacks (module docstring)."""

    def __init__(
        self,
        job: str,
        corpus: DraftCorpus | None = None,
        config: DraftsFeedConfig | None = None,
        gate: SeedGate | None = None,
    ) -> None:
        self.job = job
        self.gate = gate  # None: every text is sent (no decision)
        # False: nothing is queued or sent, the history is still kept (the co-location
        # verdict's ``seed``: groups kept whole ran faster without insertions).
        self.inserting = True
        self.corpus = corpus if corpus is not None else DraftCorpus()
        self.config = config or DraftsFeedConfig()
        self.stats = FeedStats()
        self._turns: dict[str, list[DraftText]] = {}  # task -> this job's texts, in order
        self._runs: dict[str, list[DraftText]] = {}  # trajectory -> its texts (for history)
        self._task_runs: dict[str, set[str]] = {}  # task -> trajectories with texts in _runs
        self._hosts: dict[str, set[str]] = {}  # task -> engines that ran a step of it
        self._sent: dict[tuple[str, str], set[str]] = {}  # (engine, task) -> keys sent/queued
        self._queue: dict[str, OrderedDict[str, list[DraftText]]] = {}  # engine -> task -> texts
        self._queued = 0
        self._drafting: dict[str, bool] = {}  # engine -> runs suffix decoding (its /v1/state)
        self._not_drafting: set[str] = set()
        self._wake: asyncio.Event | None = None  # made by run(), on the session's loop
        self._closing = False  # set when the session ends: no new call starts
        # What the gate reads: the session's trajectories, where each one's step runs,
        # the siblings whose texts each engine holds, each engine's /v1/state.
        self._tracked: Mapping[str, TrackedRun] = {}
        self._on: dict[str, str] = {}  # trajectory -> engine of its latest step
        self._served: dict[tuple[str, str], set[str]] = {}  # (engine, task) -> ran a step there
        self._pushed: dict[tuple[str, str], set[str]] = {}  # (engine, task) -> siblings inserted
        self._history_seeded: dict[tuple[str, str], int] = {}  # (engine, task) -> samples
        self._states: dict[str, Mapping[str, Any]] = {}  # engine -> its /v1/state
        self._state_at: dict[str, float] = {}  # engine -> when its /v1/state was read
        self._sizes: dict[str, int] | None = None  # task -> trajectories (the group's size)
        self._pool_engines = 0  # the pool's engines (track()); 0: those seen

    def track(self, runs: Mapping[str, TrackedRun], engines: int = 0) -> None:
        """The session's trajectories by id (read when a text is decided, never copied),
        and the pool's engines (over which the previous iteration spread each task's
        samples: the history an engine holds uninserted; 0: those the feed has seen)."""
        self._tracked = runs
        self._sizes = None
        self._pool_engines = engines

    # -- the session's hooks (synchronous: they only queue) ----------------------------
    def before_step(self, task_id: str, engine: str, trajectory_id: str | None = None) -> None:
        """A step of ``task_id`` (of ``trajectory_id``) goes to ``engine``: the first time,
        queue every text of the task it lacks (this job's siblings from elsewhere, then
        the history)."""
        if trajectory_id is not None:
            self._on[trajectory_id] = engine
            self._served.setdefault((engine, task_id), set()).add(trajectory_id)
        hosts = self._hosts.setdefault(task_id, set())
        if engine in hosts:
            return  # it has had the task's texts; new ones reach it as they appear
        hosts.add(engine)
        siblings = self._turns.get(task_id, [])
        # The history holds this job's finished siblings too (same keys: sent once).
        self._enqueue(engine, task_id, [*siblings, *self.corpus.texts(task_id)])

    def step_done(
        self, task_id: str, trajectory_id: str, turn: int, tokens: Sequence[int], engine: str
    ) -> None:
        """A step finished on ``engine`` with ``tokens``: a new text of the task, queued for
        every other engine that runs the task (the delta; ``engine`` holds it already)."""
        if not tokens:
            return
        texts = self._turns.setdefault(task_id, [])
        text = DraftText(
            f"{self.job}/{trajectory_id}/{turn}/{len(texts)}",  # unique: an episode may restart
            array("i", tokens[: self.config.max_text_tokens]),
            engine,
            self.job,
            trajectory_id,
        )
        texts.append(text)
        self._runs.setdefault(trajectory_id, []).append(text)
        self._task_runs.setdefault(task_id, set()).add(trajectory_id)
        self._served.setdefault((engine, task_id), set()).add(trajectory_id)
        hosts = self._hosts.setdefault(task_id, set())
        # Gated, the texts of a sibling an engine refused travel again with its new turn
        # (decided together, as the simulator decides its whole text so far); the rest
        # were sent and are skipped.
        news = self._runs[trajectory_id] if self.gate is not None else [text]
        for other in sorted(hosts - {engine}):
            self._enqueue(other, task_id, news)
        hosts.add(engine)

    def finished(self, task_id: str, trajectory_id: str, *, keep: bool = True) -> None:
        """A trajectory ended: with ``keep``, its texts join the history of its task.
        Once no trajectory of the task holds texts here, the job's copy of them goes
        (a sibling starting later gets the finished ones from the history)."""
        texts = self._runs.pop(trajectory_id, [])
        if keep:
            self.corpus.add(task_id, texts)
        live = self._task_runs.get(task_id, set())
        live.discard(trajectory_id)
        if not live:
            self._task_runs.pop(task_id, None)
            self._turns.pop(task_id, None)

    def forget_engine(self, engine: str) -> None:
        """``engine`` went down (a restart loses its cache): it gets everything again."""
        for hosts in self._hosts.values():
            hosts.discard(engine)
        for held in (self._sent, self._served, self._pushed, self._history_seeded):
            for key in [k for k in held if k[0] == engine]:
                del held[key]
        self._states.pop(engine, None)
        self._state_at.pop(engine, None)
        dropped = self._queue.pop(engine, OrderedDict())
        self._queued -= sum(len(v) for v in dropped.values())
        self._not_drafting.discard(engine)
        self._drafting.pop(engine, None)

    def pending(self) -> int:
        """Texts queued and not yet sent."""
        return self._queued

    def _enqueue(self, engine: str, task_id: str, texts: Iterable[DraftText]) -> None:
        if engine in self._not_drafting or not self.inserting:
            return
        sent = self._sent.setdefault((engine, task_id), set())
        added = 0
        for text in texts:
            if text.origin == engine or text.key in sent:
                continue
            if (
                len(sent) >= self.config.max_texts_per_engine_task
                or self._queued >= self.config.max_queued_texts
            ):
                self.stats.dropped += 1
                continue
            sent.add(text.key)
            self._queue.setdefault(engine, OrderedDict()).setdefault(task_id, []).append(text)
            self._queued += 1
            added += 1
        if added and self._wake is not None:
            self._wake.set()

    # -- the sender -----------------------------------------------------------------------
    async def run(self, client_for: Callable[[str], SeedsDrafts | None]) -> None:
        """Send what is queued, engines side by side, until cancelled; never raises."""
        self._wake = wake = asyncio.Event()
        if self._queued:
            wake.set()
        while True:
            await wake.wait()
            wake.clear()
            work = self._queue
            self._queue = {}
            self._queued = 0
            sending = asyncio.ensure_future(
                asyncio.gather(
                    *(self._send(engine, tasks, client_for) for engine, tasks in work.items())
                )
            )
            try:
                await asyncio.shield(sending)
            except asyncio.CancelledError:
                # The session is ending: the calls in flight finish (each bounded by its
                # timeout) and no new one starts, so what the workers received is what the
                # stats count; cut mid-call, a delivered batch would go uncounted.
                self._closing = True
                await sending
                st = self.stats
                log.info("%s: drafts sent %d texts (%d tokens), refused %d as not paying, "
                         "%d in failed calls", self.job, st.texts_sent, st.tokens_sent,
                         st.texts_refused, st.texts_failed)  # fmt: skip
                raise

    async def _send(
        self,
        engine: str,
        tasks: OrderedDict[str, list[DraftText]],
        client_for: Callable[[str], SeedsDrafts | None],
    ) -> None:
        for task_id, queued in tasks.items():
            texts = queued
            if self.gate is not None:
                texts = await self._gated(engine, task_id, queued, client_for(engine))
            for start in range(0, len(texts), self.config.batch_texts):
                batch = texts[start : start + self.config.batch_texts]
                client = client_for(engine)
                if self._closing or client is None or engine in self._not_drafting:
                    self._unsend(engine, task_id, batch)
                    continue
                try:
                    if not await self._drafts_from_texts(engine, client):
                        continue
                    self.stats.calls += 1
                    seeded = await client.seed_drafts(
                        self.job, task_id, [t.tokens for t in batch], timeout=self.config.timeout_s
                    )
                except (HeddleError, OSError, ValueError, KeyError, TypeError) as exc:
                    self.stats.errors += 1
                    self.stats.texts_failed += len(batch)
                    log.info("%s: drafts for %s not sent to %s (%s); offered again later",
                             self.job, task_id, engine, exc)  # fmt: skip
                    self._unsend(engine, task_id, batch)
                    continue
                self.stats.texts_sent += len(batch)
                self.stats.tokens_sent += sum(len(t.tokens) for t in batch)
                self.stats.texts_seeded += seeded

    async def _drafts_from_texts(self, engine: str, client: SeedsDrafts) -> bool:
        """Whether ``engine`` runs suffix decoding (its ``/v1/state``, asked once): where
        ``auto`` fell back to ngram, or speculation is off, nothing is sent to it."""
        known = self._drafting.get(engine)
        if known is None:
            state = await client.state()
            self._states[engine] = state
            self._state_at[engine] = time.monotonic()
            method = (state.get("speculation") or {}).get("method")
            known = self._drafting[engine] = method == "suffix"
            if not known:
                log.info("%s: worker %s does not run suffix decoding (%s); no drafts go "
                         "there", self.job, engine, method or "off")  # fmt: skip
                self._not_drafting.add(engine)
        return known

    async def _fresh_state(self, engine: str, client: SeedsDrafts) -> Mapping[str, Any]:
        """``engine``'s ``/v1/state``, read again once it is ``STATE_REFRESH_S`` old: an
        ``auto`` suffix engine rebuilds its K table as it measures acceptance, and the
        gate asks at the K it drafts with now. A failed read keeps the last one."""
        if time.monotonic() - self._state_at.get(engine, 0.0) >= STATE_REFRESH_S:
            self._state_at[engine] = time.monotonic()
            try:
                self._states[engine] = await client.state()
            except (HeddleError, OSError, ValueError, KeyError, TypeError) as exc:
                log.debug("%s: /v1/state of %s not read again (%s)", self.job, engine, exc)
        return self._states.get(engine, {})

    def _unsend(self, engine: str, task_id: str, batch: Sequence[DraftText]) -> None:
        """Forget that ``batch`` went to ``engine``: the next step of the task there
        offers it again (before_step sees the engine as new for the task)."""
        sent = self._sent.get((engine, task_id))
        if sent is not None:
            sent.difference_update(t.key for t in batch)
        hosts = self._hosts.get(task_id)
        if hosts is not None:
            hosts.discard(engine)

    # -- the seed gate (rollout/_seed_gate.py) ----------------------------------------------
    async def _gated(
        self,
        engine: str,
        task_id: str,
        texts: list[DraftText],
        client: SeedsDrafts | None,
    ) -> list[DraftText]:
        """The texts worth inserting into ``engine`` (module docstring); the others are
        counted and, a sibling's, offered again with its next turn."""
        gate = self.gate
        if gate is None or client is None or self._closing:
            return texts
        try:
            if not await self._drafts_from_texts(engine, client):
                return texts  # nothing goes there: the sender skips them
        except (HeddleError, OSError, ValueError, KeyError, TypeError):
            return texts  # the sender's call fails alike, and counts it
        state = await self._fresh_state(engine, client)
        running = [
            (run.task.id, run.traj)
            for tid, on in self._on.items()
            if on == engine and (run := self._tracked.get(tid)) is not None
        ]
        size = self._group_size(task_id)
        key = (engine, task_id)
        units: OrderedDict[str, list[DraftText]] = OrderedDict()
        for text in texts:
            units.setdefault("history" if text.job != self.job else text.trajectory, []).append(
                text
            )
        kept: list[DraftText] = []
        for unit, members in units.items():
            served = self._served.get(key, set())
            pushed = self._pushed.setdefault(key, set())
            if unit != "history" and (unit in pushed or unit in served):
                kept.extend(members)  # a sibling the engine holds: its new turns keep it current
                continue
            here = max(0, len(served | pushed) - 1)
            history = len({(t.job, t.trajectory) for t in members})
            query = gate.query(
                running,
                task_group=task_id,
                tp=int(state.get("tp") or 1),
                speculation=state.get("speculation"),
                insert_tokens=float(sum(len(t.tokens) for t in members)),
                siblings_held=here,
                siblings_after=here if unit == "history" else min(here + 1, max(0, size - 1)),
                history_held=self._history_seeded.get(key, 0),
                history_after=history if unit == "history" else 0,
                # What the engine holds uninserted: the pool's share of the earlier samples.
                history_unseeded=unseeded_history(size, self._pool_engines or len(self._states)),
            )
            if gate.decide(engine, task_id, unit, len(members), query):
                kept.extend(members)
                if unit == "history":
                    self._history_seeded[key] = history
                else:
                    pushed.add(unit)
                continue
            self.stats.texts_refused += len(members)
            self.stats.tokens_refused += sum(len(t.tokens) for t in members)
            if unit != "history":  # decided again with the sibling's next turn
                self._sent.get(key, set()).difference_update(t.key for t in members)
        return kept

    def _group_size(self, task_id: str) -> int:
        if self._sizes is None:
            sizes: dict[str, int] = {}
            for run in self._tracked.values():
                sizes[run.task.id] = sizes.get(run.task.id, 0) + 1
            self._sizes = sizes
        return self._sizes.get(task_id, 1)
