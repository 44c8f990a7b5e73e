"""The output sink: one line per record, resume from what is there, repair a torn tail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heddle.exceptions import OutputError
from heddle.operator._output import OutputSink, record_key


def _record(task: str, sample: int) -> dict[str, object]:
    return {"task_id": task, "sample": sample, "status": "done"}


def test_records_are_written_once_and_found_again(tmp_path: Path) -> None:
    path = tmp_path / "out" / "rollout.jsonl"
    sink = OutputSink(path)
    assert sink.open() == set()
    assert sink.write(_record("a", 0))
    assert sink.write(_record("a", 1))
    assert not sink.write(_record("a", 0))  # a second write of the same trajectory is refused
    sink.close()
    lines = path.read_text().splitlines()
    assert [json.loads(x)["sample"] for x in lines] == [0, 1]
    again = OutputSink(path)
    assert again.open() == {record_key("a", 0), record_key("a", 1)}
    assert not again.write(_record("a", 1))
    again.close()


def test_torn_last_line_is_cut_and_its_trajectory_runs_again(tmp_path: Path) -> None:
    path = tmp_path / "rollout.jsonl"
    path.write_text(json.dumps(_record("a", 0)) + "\n" + '{"task_id": "a", "sam')
    sink = OutputSink(path)
    assert sink.open() == {record_key("a", 0)}
    assert sink.repaired_bytes > 0
    assert sink.write(_record("a", 1))
    sink.close()
    assert [json.loads(x)["sample"] for x in path.read_text().splitlines()] == [0, 1]


def test_corrupt_middle_line_stops_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "rollout.jsonl"
    path.write_text('{"task_id": "a", "sample": 0}\nhello\n{"task_id": "a", "sample": 1}\n')
    with pytest.raises(OutputError, match="line 2 is not a Heddle output record"):
        OutputSink(path).open()
