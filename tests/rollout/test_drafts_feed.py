"""The live drafting corpus (heddle.rollout.DraftsFeed): which texts go to which engine.

``Recorder`` stands in for a worker's client (heddle.worker.WorkerClient): it records
each ``POST /v1/drafts`` the feed would send and answers ``/v1/state`` with the
engine's speculation method. The last test runs the feed inside a real session on
two sim worker processes over HTTP, with the recorder wrapped around their real
clients (the sim engine does not draft, so only the traffic is checked there).
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from heddle.api import SamplingSpec
from heddle.exceptions import WorkerUnavailableError
from heddle.rollout import (
    DraftCorpus,
    DraftsFeed,
    DraftsFeedConfig,
    DraftText,
    LocalPool,
    OutputSink,
    RolloutSession,
    SessionConfig,
    SyntheticEnvironment,
    load_workload,
    synthetic_tasks,
)
from heddle.scheduler import HARDWARE_PRESETS, MODEL_PRESETS, PerfModel
from heddle.worker import WorkerEndpoint

from .._rollout_fixtures import read_records

# Starts sim worker processes for the module: not the inner loop (README).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """Stands in for one worker's client: records the texts each call carries."""

    def __init__(
        self,
        name: str,
        method: str = "suffix",
        *,
        forward: Any = None,
        hang: asyncio.Event | None = None,
        fail: bool = False,
    ) -> None:
        self.name, self.method, self.forward = name, method, forward
        self.hang, self.fail = hang, fail
        self.calls: list[tuple[str, str, list[tuple[int, ...]]]] = []

    async def state(self) -> dict[str, Any]:
        return {"speculation": None if self.method == "off" else {"method": self.method}}

    async def seed_drafts(
        self, job: str, task_id: str, texts: Sequence[Sequence[int]], *, timeout: float = 10.0
    ) -> int:
        if self.hang is not None:
            await self.hang.wait()
        if self.fail:
            raise WorkerUnavailableError(self.name, "POST /v1/drafts: connection refused")
        self.calls.append((job, task_id, [tuple(t) for t in texts]))
        if self.forward is not None:
            return int(await self.forward.seed_drafts(job, task_id, texts, timeout=timeout))
        return len(texts)

    def texts(self, task_id: str | None = None) -> list[tuple[int, ...]]:
        return [t for _, task, ts in self.calls if task_id in (None, task) for t in ts]


async def _drain(feed: DraftsFeed, clients: dict[str, Recorder]) -> None:
    """Run the sender until the queue is empty and every call has returned."""
    sender = asyncio.create_task(feed.run(clients.get))
    for _ in range(200):
        await asyncio.sleep(0)
    while feed.pending():
        await asyncio.sleep(0.001)
    for _ in range(200):
        await asyncio.sleep(0)
    sender.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sender


def test_siblings_go_to_the_other_engines_once_each_as_deltas() -> None:
    feed = DraftsFeed("job")
    a, b, c = Recorder("a"), Recorder("b"), Recorder("c")
    clients = {"a": a, "b": b, "c": c}
    feed.before_step("T", "a")
    feed.step_done("T", "t0", 1, [1, 2, 3], "a")  # sibling 0's first turn, on a
    feed.before_step("T", "b")  # sibling 1 starts on b: gets sibling 0's turn
    feed.step_done("T", "t1", 1, [4, 5], "b")
    feed.step_done("T", "t0", 2, [6, 7], "a")  # sibling 0's second turn: b gets only it
    feed.before_step("U", "c")  # another task on c: nothing of T
    asyncio.run(_drain(feed, clients))
    assert a.texts() == [(4, 5)]  # never its own texts back
    assert b.texts() == [(1, 2, 3), (6, 7)]
    assert c.texts() == []
    feed.before_step("T", "b")  # b has the task's texts: nothing is sent again
    feed.before_step("T", "c")  # c's first step of T: both engines' texts, once
    asyncio.run(_drain(feed, clients))
    assert b.texts() == [(1, 2, 3), (6, 7)]
    assert sorted(c.texts("T")) == [(1, 2, 3), (4, 5), (6, 7)]
    assert feed.stats.texts_sent == 6 and feed.stats.tokens_sent == 14
    assert all(job == "job" for r in clients.values() for job, _, _ in r.calls)


def test_history_outlives_the_job_and_is_bounded() -> None:
    corpus = DraftCorpus(per_task=2, max_tasks=2)
    first = DraftsFeed("iter-1", corpus)
    for sample in range(3):  # three finished samples of task T on engine a
        first.before_step("T", "a")
        first.step_done("T", f"t{sample}", 1, [10 + sample, 0], "a")
        first.finished("T", f"t{sample}")
    first.step_done("T", "failed", 1, [99], "a")
    first.finished("T", "failed", keep=False)  # a failed trajectory is no history
    assert corpus.trajectories("T") == 2  # the newest two of three
    assert [tuple(t.tokens) for t in corpus.texts("T")] == [(12, 0), (11, 0)]
    # The next iteration's job: engine b lacks the history; engine a produced it.
    second = DraftsFeed("iter-2", corpus)
    a, b = Recorder("a"), Recorder("b")
    second.before_step("T", "a")
    second.before_step("T", "b")
    asyncio.run(_drain(second, {"a": a, "b": b}))
    assert a.texts() == [] and b.texts() == [(12, 0), (11, 0)]
    # Its own finished trajectories join the history, but reach its engines as siblings.
    second.step_done("T", "s0", 1, [50], "b")
    second.finished("T", "s0")
    assert [t.job for t in corpus.texts("T")] == ["iter-2", "iter-1"]
    assert corpus.texts("T", not_job="iter-2")[0].job == "iter-1"
    # At most max_tasks task ids: the least recently used goes.
    corpus.add("U", [DraftText("k", array("i", [1]), None, "x")])
    corpus.texts("T")  # T used again
    corpus.add("V", [DraftText("k", array("i", [2]), None, "x")])
    assert len(corpus) == 2 and corpus.trajectories("U") == 0 and corpus.trajectories("T") == 2


def test_a_feed_told_not_to_insert_sends_nothing_and_still_keeps_the_history() -> None:
    # The co-location verdict's ``seed`` False: groups kept whole ran faster without.
    corpus = DraftCorpus()
    feed = DraftsFeed("job", corpus)
    feed.inserting = False
    a, b = Recorder("a"), Recorder("b")
    feed.before_step("T", "a")
    feed.step_done("T", "t0", 1, [1, 2, 3], "a")
    feed.before_step("T", "b")
    feed.step_done("T", "t1", 1, [4, 5], "b")
    feed.finished("T", "t0")
    asyncio.run(_drain(feed, {"a": a, "b": b}))
    assert a.calls == [] and b.calls == [] and feed.pending() == 0
    assert [tuple(t.tokens) for t in corpus.texts("T")] == [(1, 2, 3)]


def test_finished_siblings_reach_later_engines_once_then_from_the_history() -> None:
    feed = DraftsFeed("job")
    feed.before_step("T", "a")
    feed.step_done("T", "t0", 1, [1, 2], "a")
    feed.step_done("T", "t1", 1, [3], "a")
    feed.finished("T", "t0")  # in the history now, and still among t1's siblings
    b = Recorder("b")
    feed.before_step("T", "b")
    asyncio.run(_drain(feed, {"b": b}))
    assert sorted(b.texts()) == [(1, 2), (3,)]  # each once
    feed.finished("T", "t1")  # the task's last trajectory with texts: the job's copy goes
    c = Recorder("c")
    feed.before_step("T", "c")  # a sample that starts late still gets them, from the history
    asyncio.run(_drain(feed, {"c": c}))
    assert sorted(c.texts()) == [(1, 2), (3,)]


def test_traffic_is_bounded_and_texts_are_cut() -> None:
    config = DraftsFeedConfig(max_text_tokens=3, max_texts_per_engine_task=2, batch_texts=2)
    feed = DraftsFeed("job", config=config)
    b = Recorder("b")
    feed.before_step("T", "b")
    for turn in range(5):
        feed.step_done("T", "t0", turn, list(range(10)), "a")
    asyncio.run(_drain(feed, {"b": b}))
    assert b.texts() == [(0, 1, 2), (0, 1, 2)]  # two texts for (b, T), each cut to 3 tokens
    assert feed.stats.dropped == 3
    tight = DraftsFeed("job", config=DraftsFeedConfig(max_queued_texts=2))
    for task in "TUV":
        tight.before_step(task, "b")
        tight.step_done(task, f"{task}0", 1, [1], "a")
    assert tight.pending() == 2 and tight.stats.dropped == 1


def test_the_hooks_never_wait_and_failures_are_counted_then_offered_again() -> None:
    async def scenario() -> None:
        hang = asyncio.Event()
        slow, down = Recorder("slow", hang=hang), Recorder("down", fail=True)
        clients = {"slow": slow, "down": down}
        feed = DraftsFeed("job")
        sender = asyncio.create_task(feed.run(clients.get))
        feed.before_step("T", "slow")
        feed.before_step("T", "down")
        started = time.perf_counter()
        for turn in range(40):  # a worker that never answers holds up no step
            feed.step_done("T", "t0", turn, [turn, turn + 1], "other")
        assert time.perf_counter() - started < 0.5
        for _ in range(50):
            await asyncio.sleep(0)
        assert feed.stats.errors >= 1 and not sender.done()  # logged and counted, not raised
        down.fail = False
        feed.before_step("T", "down")  # the next step there offers the texts again
        hang.set()
        while feed.pending():
            await asyncio.sleep(0.001)
        for _ in range(200):
            await asyncio.sleep(0)
        sender.cancel()
        assert len(down.texts()) == 40 and len(set(down.texts())) == 40
        assert len(slow.texts()) == 40 and feed.stats.errors == 2
        assert not sender.done() or sender.cancelled()

    asyncio.run(scenario())


def test_engines_without_suffix_decoding_get_nothing() -> None:
    feed = DraftsFeed("job")
    ngram, suffix = Recorder("n", "ngram"), Recorder("s")
    for engine in ("n", "s"):
        feed.before_step("T", engine)
    feed.step_done("T", "t0", 1, [1, 2], "x")
    asyncio.run(_drain(feed, {"n": ngram, "s": suffix}))
    assert ngram.calls == [] and suffix.texts() == [(1, 2)]
    feed.step_done("T", "t0", 2, [3], "x")  # asked once: nothing is queued for it again
    assert feed.pending() == 1


def test_forgotten_engine_gets_everything_again() -> None:
    feed = DraftsFeed("job")
    b = Recorder("b")
    feed.before_step("T", "b")
    feed.step_done("T", "t0", 1, [1], "a")
    asyncio.run(_drain(feed, {"b": b}))
    feed.forget_engine("b")  # it went down: a restarted engine has an empty cache
    feed.before_step("T", "b")
    asyncio.run(_drain(feed, {"b": b}))
    assert b.texts() == [(1,), (1,)]


class _RecordingFeed(DraftsFeed):
    """The session's feed with a recorder around each worker's real client; the sim
    engine does not draft, so its /v1/state is taken to say suffix."""

    def __init__(self, job: str) -> None:
        super().__init__(job)
        self.recorders: dict[str, Recorder] = {}

    async def run(self, client_for: Callable[[str], Any]) -> None:
        def wrapped(name: str) -> Recorder | None:
            client = client_for(name)
            if client is None:
                return None
            if name not in self.recorders:
                self.recorders[name] = Recorder(name, forward=client)
            return self.recorders[name]

        await super().run(wrapped)


def test_a_session_feeds_each_worker_the_siblings_it_did_not_run(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    workload = load_workload(str(ROOT / "examples" / "synthetic" / "workload.yaml"))
    tasks = synthetic_tasks(4, workload, seed=0)
    env = SyntheticEnvironment(workload, 4, 4, seed=0, tool_time_scale=0.05)
    feed = _RecordingFeed("feed")
    out = tmp_path / "out.jsonl"
    session = RolloutSession(
        job="feed",
        tasks=tasks,
        samples_per_task=4,
        environment=env,
        workers=workers,
        sink=OutputSink(out),
        perf=PerfModel(MODEL_PRESETS["qwen3-8b"], HARDWARE_PRESETS["h100-sxm"]),
        sampling=SamplingSpec(max_tokens_per_turn=256, max_total_tokens=600),
        max_turns=4,
        policy="slime",  # least-load routing at every step: siblings spread over both
        config=SessionConfig(replan_interval_s=0.3, health_interval_s=0.2),
        drafts=feed,
    )
    result = asyncio.run(session.run())
    records = read_records(out)
    assert len(records) == 16 and result.drafts is not None
    # Each step's generated tokens, with the worker that ran it.
    made: dict[str, dict[tuple[int, ...], set[str]]] = {}
    for r in records:
        ids = r["response_token_ids"]
        turns = [tuple(ids[g["response_start"] : g["response_end"]]) for g in r["segments"]]
        for turn, worker in zip(turns, r["placement"]["steps"], strict=True):
            made.setdefault(r["task_id"], {}).setdefault(turn, set()).add(worker)
    sent = 0
    for name, recorder in feed.recorders.items():
        for job, task_id, texts in recorder.calls:
            assert job == "feed"
            for text in texts:  # a sibling's turn, made on another worker
                assert text in made[task_id] and name not in made[task_id][text]
                sent += 1
    assert sent == result.drafts["texts_sent"] > 0 and result.drafts["errors"] == 0
    # Every turn reached every worker that ran its task and did not make it, once.
    hosts = {
        task: {w for r in records if r["task_id"] == task for w in r["placement"]["steps"]}
        for task in made
    }
    expected = sum(len(hosts[task] - where) for task in made for where in made[task].values())
    assert sent == expected > 0


class _Rebuilding(Recorder):
    """A worker whose ``auto`` K table is rebuilt as it measures acceptance: each read of
    its /v1/state shows the next table; ``fail`` after the first read."""

    def __init__(self, tables: list[list[list[int]]], *, fail_after: int | None = None) -> None:
        super().__init__("w")
        self.tables, self.reads, self.fail_after = tables, 0, fail_after

    async def state(self) -> dict[str, Any]:
        if self.fail_after is not None and self.reads >= self.fail_after:
            raise WorkerUnavailableError("w", "GET /v1/state: connection refused")
        table = self.tables[min(self.reads, len(self.tables) - 1)]
        self.reads += 1
        return {"tp": 1, "speculation": {"method": "suffix", "by_batch_size": table}}


def test_the_gate_reads_an_engines_k_table_again_once_it_is_old(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from heddle.rollout import _drafts_feed

    start, learned = [[1, 3, 1], [4, 8, 0]], [[1, 8, 4]]
    feed = DraftsFeed("job")
    client = _Rebuilding([start, learned])

    async def reads() -> list[Any]:
        assert await feed._drafts_from_texts("w", client)  # the first read: suffix, start
        got = [(await feed._fresh_state("w", client))["speculation"]["by_batch_size"]]
        monkeypatch.setattr(_drafts_feed, "STATE_REFRESH_S", 0.0)  # now it is old
        got.append((await feed._fresh_state("w", client))["speculation"]["by_batch_size"])
        return got

    assert asyncio.run(reads()) == [start, learned]
    assert client.reads == 2
    # A failed read keeps the last table (and the feed goes on).
    failing = _Rebuilding([start, learned], fail_after=1)
    feed = DraftsFeed("job")

    async def kept() -> Any:
        assert await feed._drafts_from_texts("w", failing)
        return (await feed._fresh_state("w", failing))["speculation"]["by_batch_size"]

    assert asyncio.run(kept()) == start
