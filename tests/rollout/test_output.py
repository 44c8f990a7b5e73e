"""The output sink: one line per record, resume from what is there, repair a torn tail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from heddle.exceptions import OutputError
from heddle.rollout import OutputSink, lock_path, record_key


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


def test_a_second_sink_on_the_same_output_is_refused_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "rollout.jsonl"
    first = OutputSink(path)
    first.open()
    with pytest.raises(
        OutputError, match=rf"in use by another Heddle session \(pid {os.getpid()}\)"
    ):
        OutputSink(path).open()
    assert first.write(_record("a", 0))
    first.close()
    again = OutputSink(path)  # the lock went with the first session
    assert again.open() == {record_key("a", 0)}
    again.close()


@pytest.mark.parametrize(
    "content",
    [
        b"token-without-a-newline",
        b"# notes\nlast line, no newline",
        json.dumps(_record("a", 0)).encode() + b"\n" + b"not a record, torn or not",
    ],
)
def test_a_file_that_is_not_an_output_is_refused_and_left_as_it_was(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(OutputError, match="not a Heddle output record"):
        OutputSink(path).open()
    assert path.read_bytes() == content


def test_text_with_unicode_line_breaks_stays_on_one_line(tmp_path: Path) -> None:
    """A random-weight model emits U+0085, U+2028 and U+2029; splitlines() must not split."""
    path = tmp_path / "rollout.jsonl"
    text = "a\u0085b\u2028c\u2029d\x1ce\u00e9"
    sink = OutputSink(path)
    sink.open()
    assert sink.write({**_record("t", 0), "text": text})
    assert sink.write({**_record("t", 1), "text": "plain"})
    sink.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(x)["text"] for x in lines] == [text, "plain"]
    again = OutputSink(path)
    assert again.open() == {record_key("t", 0), record_key("t", 1)}
    again.close()
    assert "\u00e9" in path.read_text(encoding="utf-8")  # other text stays as it is (UTF-8)


_FILL_DISK = """
import resource, signal, sys
from pathlib import Path
from heddle.rollout import OutputSink
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
sink = OutputSink(Path(sys.argv[1]))
sink.open()
for i in range(1000):
    sink.write({"task_id": "t", "sample": i, "pad": "x" * 170})
"""


@pytest.mark.slow
def test_a_write_the_disk_refuses_leaves_no_torn_record(tmp_path: Path) -> None:
    path = tmp_path / "rollout.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", _FILL_DISK, str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("heddle.exceptions.OutputError: writing to the output"), proc.stderr
    assert "File too large" in last
    data = path.read_bytes()
    assert 0 < len(data) <= 3000 and data.endswith(b"\n")
    samples = [json.loads(line)["sample"] for line in data.splitlines()]
    assert samples == list(range(len(samples)))
    sink = OutputSink(path)  # and the next session resumes from it untouched
    assert len(sink.open()) == len(samples) and sink.repaired_bytes == 0
    sink.close()


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    path = tmp_path / "rollout.jsonl"
    lock_path(path).symlink_to(target)
    with pytest.raises(OutputError, match=r"cannot create the lock file .*symbolic links"):
        OutputSink(path).open()
    assert target.read_text() == "keep me\n"


def test_without_following_symlinks_a_swapped_in_link_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(json.dumps(_record("x", 0)) + "\n")
    before = elsewhere.read_bytes()
    path = tmp_path / "rollout.jsonl"
    path.symlink_to(elsewhere)
    with pytest.raises(OutputError, match=r"cannot open the output .*symbolic links"):
        OutputSink(path, follow_symlinks=False).open()
    assert elsewhere.read_bytes() == before
    sink = OutputSink(path)  # local mode: the user's own link is followed
    assert sink.open() == {record_key("x", 0)}
    sink.close()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # reading it would wait for ever
    with pytest.raises(OutputError, match="is not a regular file"):
        OutputSink(fifo).open()
