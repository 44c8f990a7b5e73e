"""The pool's previous rollout is kept, read back as untrusted, and is what the next
session's predictor and decisions start from.

The synthetic example job (16 tasks x 4 samples on two GPUs) stands in for a job; the
records stand in for a previous rollout of short trajectories (about 100 tokens each),
far below what the predictor's prior expects of a 3,000-token budget.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from pathlib import Path

import pytest

from heddle.exceptions import ConfigError
from heddle.rollout import (
    HISTORY_DIR,
    LocalJob,
    PreviousRollouts,
    _previous,
    decision_key,
    perf_model_for,
    prepare_job,
    read_history,
)
from heddle.rollout._prior import prior_sketch
from heddle.scheduler import FinishedTrajectory

EXAMPLE = Path(__file__).parents[2] / "examples" / "synthetic"


def _short_rollout(n: int = 64) -> tuple[FinishedTrajectory, ...]:
    return tuple(
        FinishedTrajectory(f"old-t{i // 4}", 150, 90 + i % 20, 2, (40, 50 + i % 20), (30,))
        for i in range(n)
    )


@pytest.fixture
def local() -> LocalJob:
    return prepare_job(EXAMPLE / "job.yaml", EXAMPLE / "pool.yaml")


class TestKept:
    def test_a_rollout_reads_back_as_it_was_kept(self, tmp_path: Path) -> None:
        store = PreviousRollouts(tmp_path / "history")
        assert store.get("pool") == ()  # none kept yet: the prior
        store.put("pool", _short_rollout())
        assert store.get("pool") == _short_rollout()
        assert store.get("other") == ()  # per pool
        store.put("pool", ())  # a rollout that finished nothing keeps the last one
        assert store.get("pool") == _short_rollout()

    def test_a_trajectory_of_many_turns_keeps_its_length(self, tmp_path: Path) -> None:
        turns = tuple([3] * 2_000)
        long = FinishedTrajectory("g", 10, sum(turns), 2_000, turns, ())
        store = PreviousRollouts(tmp_path)
        store.put("pool", [long])
        (back,) = store.get("pool")
        assert back.total_tokens == long.total_tokens == sum(back.turn_tokens)
        assert len(back.turn_tokens) == back.turns == 1_024

    def test_a_file_too_large_is_not_read_and_a_rollout_too_large_keeps_its_newest(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        monkeypatch.setattr(_previous, "MAX_BYTES", 4_000)
        store = PreviousRollouts(tmp_path)
        rollout = _short_rollout(200)  # about 8 KB as kept
        store.put("pool", rollout)
        kept = store.get("pool")
        assert 0 < len(kept) < 200 and kept == rollout[-len(kept) :]
        (tmp_path / "pool.json").write_text(" " * 5_000)
        with caplog.at_level(logging.WARNING, "heddle.run"):
            assert store.get("pool") == ()
        assert any("over 4000 bytes" in r.getMessage() for r in caplog.records)

    def test_links_and_fifos_are_neither_read_nor_written_through(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """On a shared volume another job's author may put a link where a file is kept."""
        store = PreviousRollouts(tmp_path / "history")
        store.put("pool", _short_rollout())
        kept = tmp_path / "history" / "pool.json"
        elsewhere = tmp_path / "someone-elses.jsonl"
        elsewhere.write_text("theirs\n")
        kept.unlink()
        kept.symlink_to(elsewhere)
        fifo = tmp_path / "history" / "fifo.json"
        os.mkfifo(fifo)  # reading it would wait for a writer forever
        with caplog.at_level(logging.WARNING, "heddle.run"):
            assert store.get("pool") == () and store.get("fifo") == ()
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 2 and all(s.endswith("starting from the prior") for s in said)
        # A link where the file is written first: replaced, never written through.
        partial = kept.with_suffix(f".{os.getpid()}.tmp")
        partial.symlink_to(elsewhere)
        store.put("pool", _short_rollout())
        assert elsewhere.read_text() == "theirs\n"
        assert store.get("pool") == _short_rollout()

    def test_the_default_folder_is_beside_the_decisions(self) -> None:
        assert Path(".heddle/history") == HISTORY_DIR


class TestUntrusted:
    @pytest.mark.parametrize(
        ("data", "said"),
        [
            ({"format": "other", "records": []}, "not a previous rollout"),
            ({"format": "heddle.previous-rollout/v1", "records": {}}, "'records' must be a list"),
            ({"format": "heddle.previous-rollout/v1", "records": [["g", 1, 0, 1, [], []]]},
             "record 0 must be"),
            ({"format": "heddle.previous-rollout/v1", "records": [["g", -1, 5, 1, [5], []]]},
             "record 0 must be"),
            ({"format": "heddle.previous-rollout/v1", "records": [["g", 1, 5, 1, ["5"], []]]},
             "record 0 must be"),
            ({"format": "heddle.previous-rollout/v1", "records": [["g", 1, 1 << 30, 1, [], []]]},
             "record 0 must be"),
        ],
    )  # fmt: skip
    def test_a_bad_rollout_is_refused_in_one_sentence(self, data: object, said: str) -> None:
        with pytest.raises(ConfigError) as refused:
            read_history(data, "h.json")
        text = str(refused.value)
        assert text.startswith("h.json: ") and said in text and "\n" not in text

    def test_a_bad_file_is_set_aside_and_the_prior_used(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        store = PreviousRollouts(tmp_path)
        for text in ("{half", json.dumps({"format": "heddle.previous-rollout/v1"})):
            (tmp_path / "pool.json").write_text(text)
            caplog.clear()
            with caplog.at_level(logging.WARNING, "heddle.run"):
                assert store.get("pool") == ()
            (warned,) = [r.getMessage() for r in caplog.records]
            assert "pool.json" in warned and warned.endswith("starting from the prior")


class TestStartsFromIt:
    def test_the_sketch_predicts_from_the_previous_rollout(self, local: LocalJob) -> None:
        prior = prior_sketch(local, "sibling")
        seeded = prior_sketch(replace(local, history=_short_rollout()), "sibling")
        # The prior expects hundreds of tokens or more of a 3,000-token budget; the
        # previous rollout says about 100, and the decisions simulate its records.
        mean = sum(t.predicted_remaining_tokens for t in seeded.trajectories) / 64
        prior_mean = sum(t.predicted_remaining_tokens for t in prior.trajectories) / 64
        assert 60 < mean < 200 < prior_mean
        assert seeded.records == list(_short_rollout())

    def test_the_decisions_key_names_the_previous_rollout(self, local: LocalJob) -> None:
        perf = perf_model_for(local.pool)
        keys = {
            decision_key(replace(local, history=h), perf)
            for h in ((), _short_rollout(), _short_rollout(60))
        }
        assert len(keys) == 3
