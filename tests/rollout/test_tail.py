"""RecordTail: a rollout output read while it is written, each record once, whole lines only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from heddle.exceptions import OutputError
from heddle.rollout import OutputSink, RecordTail, encode_record


def _record(task: str, sample: int) -> dict[str, Any]:
    return {
        "task_id": task,
        "sample": sample,
        "status": "done",
        "messages": [],
        "prompt_token_ids": [1],
        "response_token_ids": [2, 3],
        "response_mask": [1, 1],
    }


def _line(task: str, sample: int) -> bytes:
    return (encode_record(_record(task, sample)) + "\n").encode()


def _keys(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(r["task_id"], r["sample"]) for r in records]


def test_a_missing_file_is_no_records_yet(tmp_path: Path) -> None:
    assert RecordTail(tmp_path / "out.jsonl").read() == []


def test_a_line_without_its_newline_waits_until_it_is_whole(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    tail = RecordTail(out)
    whole = _line("a", 0)
    out.write_bytes(_line("a", 1) + whole[:10])
    assert _keys(tail.read()) == [("a", 1)]
    assert tail.read() == []  # the half line is not read, nor the first again
    with out.open("ab") as f:
        f.write(whole[10:])
    assert _keys(tail.read()) == [("a", 0)]
    assert tail.count == 2


def test_the_writers_repair_of_a_torn_line_yields_that_record_once(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(_line("a", 0) + _line("a", 1)[:25])  # a crash mid-write
    tail = RecordTail(out)
    assert _keys(tail.read()) == [("a", 0)]
    sink = OutputSink(out)  # a restarted session cuts the torn line and appends again
    assert sink.open() == {"a\x000"}
    assert sink.repaired_bytes == 25
    sink.write(_record("a", 1))
    sink.close()
    assert _keys(tail.read()) == [("a", 1)]
    assert tail.read() == []


def test_a_file_written_anew_is_reread_without_repeating_records(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(_line("a", 0) + _line("a", 1) + _line("b", 0))
    tail = RecordTail(out)
    assert len(tail.read()) == 3
    out.write_bytes(_line("a", 1) + _line("c", 0))  # shorter than what was read: a new file
    assert _keys(tail.read()) == [("c", 0)]


def test_a_line_that_is_not_a_record_is_one_sentence_naming_the_line(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(_line("a", 0) + b"not json\n")
    with pytest.raises(OutputError, match=r"out\.jsonl line 2 is not JSON"):
        RecordTail(out).read()
    out.write_bytes(json.dumps({"task_id": "a", "sample": "x"}).encode() + b"\n")
    with pytest.raises(OutputError, match=r"line 1: sample must be an integer"):
        RecordTail(out).read()
