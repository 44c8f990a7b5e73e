"""The start-up decisions are kept, and a job with the same inputs reuses them.

The synthetic example (64 trajectories on two GPUs) with its shape unpinned and the
workers drafting with ``suffix`` stands in for a job whose session decides both its
shape and co-location; its mini-simulations take a second or two here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from heddle.exceptions import ConfigError
from heddle.rollout import (
    AHEAD_WAIT_LIMIT_S,
    DecidedRun,
    DecisionCache,
    LocalJob,
    PreviousRollouts,
    announce_next,
    decide_run,
    decision_key,
    perf_model_for,
    prepare_job,
    read_decided,
    run_local,
    worker_options,
)
from heddle.worker import Speculation

EXAMPLE = Path(__file__).parents[2] / "examples" / "synthetic"
SUFFIX = Speculation.of("suffix", 4)


@pytest.fixture
def unpinned() -> LocalJob:
    """The example job on its pool with no pinned shape, drafting with suffix decoding."""
    local = prepare_job(EXAMPLE / "job.yaml", EXAMPLE / "pool.yaml")
    return replace(local, pool=replace(local.pool, shape=None, speculation=SUFFIX))


def _key(local: LocalJob) -> str:
    return decision_key(local, perf_model_for(local.pool))


class TestTheKey:
    def test_what_an_iteration_changes_leaves_the_key_alone(self, unpinned: LocalJob) -> None:
        # A new iteration: another name, output and checkpoint, other prompts of about
        # the same length (the mean within the 5% grid).
        tasks = [
            replace(t, messages=[{"role": "user", "content": "y" * len(t.messages[0]["content"])}])
            for t in unpinned.tasks.tasks
        ]
        later = replace(
            unpinned,
            job=replace(unpinned.job, name="iteration-2"),
            output=unpinned.output.with_name("iteration-2.jsonl"),
            tasks=replace(unpinned.tasks, tasks=tasks),
        )
        assert _key(later) == _key(unpinned)

    def test_each_input_of_the_decisions_changes_it(self, unpinned: LocalJob) -> None:
        job, pool, tasks = unpinned.job, unpinned.pool, unpinned.tasks
        changed = [
            replace(unpinned, job=replace(job, samples_per_task=8)),
            replace(unpinned, job=replace(job, policy="verl")),
            replace(unpinned, job=replace(job, max_turns=4)),
            replace(unpinned, job=replace(job, sampling=replace(job.sampling,
                                                                max_total_tokens=6000))),
            replace(unpinned, pool=replace(pool, gpus=1, tensor_parallel_sizes=(1,))),
            replace(unpinned, pool=replace(pool, speculation=Speculation.of("ngram", 4))),
            replace(unpinned, tasks=replace(tasks, tasks=tasks.tasks[:-1])),
            replace(unpinned, workload=None),
        ]  # fmt: skip
        keys = {_key(c) for c in changed}
        assert len(keys) == len(changed) and _key(unpinned) not in keys


class TestReuse:
    def test_the_next_run_takes_the_kept_decisions_and_spends_nothing(
        self, unpinned: LocalJob, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        perf = perf_model_for(unpinned.pool)
        cache = DecisionCache(tmp_path / "decisions")
        first = decide_run(unpinned, perf, cache=cache)
        assert not first.reused and first.took_s == first.decided_s > 0.0
        assert first.colocation is not None  # both decisions were asked
        (kept,) = (tmp_path / "decisions").iterdir()
        assert kept.name == f"{first.key}.json"
        with caplog.at_level(logging.INFO, "heddle.run"):
            second = decide_run(unpinned, perf, cache=cache)
        assert second.reused and second.took_s == 0.0
        assert (second.key, second.plan, second.colocation) == (
            first.key, first.plan, first.colocation
        )  # fmt: skip
        assert any("reused from an earlier run" in r.getMessage() for r in caplog.records)

    def test_fresh_decides_again_and_keeps_the_new_answer(
        self, unpinned: LocalJob, tmp_path: Path
    ) -> None:
        perf = perf_model_for(unpinned.pool)
        folder = tmp_path / "decisions"
        first = decide_run(unpinned, perf, cache=DecisionCache(folder))
        fresh = decide_run(unpinned, perf, cache=DecisionCache(folder, reuse=False))
        assert not fresh.reused and fresh.plan == first.plan
        kept = json.loads((folder / f"{fresh.key}.json").read_text())
        assert kept["decidedSeconds"] == round(fresh.decided_s, 3)

    def test_a_record_is_taken_only_on_prompts_of_about_its_length(
        self, unpinned: LocalJob, tmp_path: Path
    ) -> None:
        perf = perf_model_for(unpinned.pool)
        cache = DecisionCache(tmp_path)
        decide_run(unpinned, perf, cache=cache)

        def scaled(factor: float) -> LocalJob:
            tasks = [
                replace(t, messages=[{"role": "user",
                                      "content": "x" * round(len(t.messages[0]["content"])
                                                             * factor)}])
                for t in unpinned.tasks.tasks
            ]  # fmt: skip
            return replace(unpinned, tasks=replace(unpinned.tasks, tasks=tasks))

        assert decision_key(scaled(1.04), perf) == decision_key(unpinned, perf)
        assert decide_run(scaled(1.04), perf, cache=cache).reused  # within 5%
        assert not decide_run(scaled(1.10), perf, cache=cache).reused  # decided afresh

    def test_a_pools_record_is_taken_only_under_the_same_key(self, unpinned: LocalJob) -> None:
        perf = perf_model_for(unpinned.pool)
        decided = decide_run(unpinned, perf)
        record = read_decided(decided.as_dict(), unpinned, "status.decisions")
        assert decide_run(unpinned, perf, earlier=record).reused
        other = replace(record, key="another job's inputs")
        assert not decide_run(unpinned, perf, earlier=other).reused


class TestUntrustedRecords:
    def _record(self, local: LocalJob) -> dict[str, object]:
        plan_shape = [{"tp": 1, "replicas": 2}]
        return {"format": "heddle.decisions/v1", "key": _key(local), "shape": plan_shape,
                "policy": "heddle", "decidedSeconds": 1.5, "promptMeanTokens": 150.0,
                "colocation": {"colocate": True, "reason": "kept", "seed": True}}  # fmt: skip

    def test_a_good_record_reads_back(self, unpinned: LocalJob) -> None:
        run = read_decided(self._record(unpinned), unpinned, "here")
        assert isinstance(run, DecidedRun) and str(run.plan.shape) == "2xTP1"
        assert run.colocation is not None and run.colocation.colocate

    @pytest.mark.parametrize(
        ("change", "said"),
        [
            ({"format": "v0"}, "not a decisions record"),
            ({"key": 7}, "'key' and 'policy' must be strings"),
            ({"shape": [{"tp": 1}]}, "'shape' must be a list"),
            ({"shape": [{"tp": 2, "replicas": 4}]}, "needs 8 GPUs but the budget is 2"),
            ({"shape": [{"tp": 4, "replicas": 1}]}, "uses TP4"),
            ({"policy": "mine"}, "mine"),
            ({"maxTrajectoriesInFlight": 0}, "positive count"),
            ({"decidedSeconds": "soon"}, "number of seconds"),
            ({"promptMeanTokens": -1}, "number of tokens"),
            ({"colocation": {"colocate": "yes"}}, "'colocation' must be"),
        ],
    )
    def test_a_bad_record_is_refused_in_one_sentence(
        self, unpinned: LocalJob, change: dict[str, object], said: str
    ) -> None:
        with pytest.raises(ConfigError) as refused:
            read_decided({**self._record(unpinned), **change}, unpinned, "status.decisions")
        said_in_full = str(refused.value)
        assert said_in_full.startswith("status.decisions: ") and said in said_in_full
        assert "\n" not in said_in_full

    def test_a_bad_kept_file_is_set_aside_and_decided_afresh(
        self, unpinned: LocalJob, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        perf = perf_model_for(unpinned.pool)
        folder = tmp_path / "decisions"
        folder.mkdir()
        key = decision_key(unpinned, perf)
        for text in ("{not json", json.dumps({**self._record(unpinned), "shape": "all"})):
            (folder / f"{key}.json").write_text(text)
            caplog.clear()
            with caplog.at_level(logging.WARNING, "heddle.run"):
                decided = decide_run(unpinned, perf, cache=DecisionCache(folder))
            assert not decided.reused
            (warned,) = [r.getMessage() for r in caplog.records]
            assert str(folder) in warned and warned.endswith("deciding afresh")
        # The fresh answer replaced the bad file: the next run reuses it.
        assert decide_run(unpinned, perf, cache=DecisionCache(folder)).reused

    def test_a_folder_that_cannot_be_written_costs_only_the_reuse(
        self, unpinned: LocalJob, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        blocked = tmp_path / "file"
        blocked.write_text("")  # a file where the folder should be
        with caplog.at_level(logging.WARNING, "heddle.run"):
            decided = decide_run(unpinned, perf_model_for(unpinned.pool),
                                 cache=DecisionCache(blocked / "decisions"))  # fmt: skip
        assert not decided.reused
        assert any("decisions not kept" in r.getMessage() for r in caplog.records)


class TestAnnouncedAhead:
    """Decisions one session takes ahead for the next, announced in the folder both read
    (a session pod's volume): the next session waits for them instead of deciding. The
    deciding side runs in a thread of its own here, through the folder only, as another
    process would (not this process's in-process futures)."""

    def test_the_next_session_waits_for_them_and_decides_nothing(
        self, unpinned: LocalJob, tmp_path: Path
    ) -> None:
        perf = perf_model_for(unpinned.pool)
        folder = tmp_path / "decisions"
        ahead = announce_next(unpinned, perf, None, DecisionCache(folder), decided_s=5.0)
        marker = folder / f"{ahead.key}.pending"
        assert (DecisionCache(folder).pending_until(ahead.key) or 0.0) > time.time()

        def other_process() -> None:
            time.sleep(0.5)  # the next session is already waiting
            ahead.take()

        deciding = threading.Thread(target=other_process)
        deciding.start()
        decided = decide_run(unpinned, perf, cache=DecisionCache(folder))
        deciding.join()
        assert decided.reused and decided.key == ahead.key, decided
        assert decided.waited_s >= 0.5 and decided.took_s == decided.waited_s
        assert not marker.exists()  # the word taken back once kept

    def test_a_marker_past_its_time_or_not_one_is_not_waited_for(
        self, unpinned: LocalJob, tmp_path: Path
    ) -> None:
        folder = tmp_path / "decisions"
        folder.mkdir()
        cache, key = DecisionCache(folder), _key(unpinned)
        marker = folder / f"{key}.pending"
        fmt = "heddle.decisions-pending/v1"
        for text in (
            json.dumps({"format": fmt, "until": time.time() - 1.0}),  # its decider died
            "not json",
            json.dumps({"format": "other", "until": time.time() + 60.0}),
            json.dumps({"format": fmt, "until": "soon"}),
            json.dumps([fmt]),
        ):
            marker.write_text(text)
            started = time.monotonic()
            assert cache.wait(key) == 0.0 and time.monotonic() - started < 0.5, text
        # A marker on a shared volume promising the far future is believed only so far.
        marker.write_text(json.dumps({"format": fmt, "until": 1e12}))
        until = cache.pending_until(key)
        assert until is not None and until <= time.time() + AHEAD_WAIT_LIMIT_S
        marker.unlink()
        marker.symlink_to(folder / "elsewhere")  # never read through a link
        assert cache.pending_until(key) is None
        assert DecisionCache(folder, reuse=False).wait(key) == 0.0  # --fresh-decisions


@pytest.mark.slow  # real worker processes (the simulated engine)
def test_an_in_process_loop_takes_the_next_iterations_decisions_ahead(
    unpinned: LocalJob, tmp_path: Path
) -> None:
    """Two iterations in one process, as the Python client runs a trainer's loop: the
    first, ending, decides the second's on its own rollout; the second waits for that
    (or finds it done) instead of deciding."""
    decisions = DecisionCache(tmp_path / "decisions")
    history = PreviousRollouts(tmp_path / "history")
    local = replace(unpinned, pool=replace(unpinned.pool, speculation=Speculation.of("off")))
    options = worker_options(local, "sim", time_scale=0.05)

    async def iteration(name: str) -> dict[str, Any]:
        job = replace(local, output=tmp_path / f"{name}.jsonl")
        summary, _ = await run_local(job, options, decisions=decisions, history=history,
                                     ahead=True)  # fmt: skip
        return summary

    async def loop() -> tuple[dict[str, Any], dict[str, Any]]:
        return await iteration("first"), await iteration("second")

    first, second = asyncio.run(loop())
    assert first["history_records"] == 0 and not first["decisions"]["reused"]
    assert second["history_records"] == 64
    assert second["decisions"]["reused"], second["decisions"]
    assert second["decisions_s"] < first["decisions_s"] + 1.0  # at most the wait for it
    assert second["decisions"]["key"] == decision_key(
        replace(local, history=history.get(local.pool.name)), perf_model_for(local.pool)
    ) != first["decisions"]["key"]  # fmt: skip
