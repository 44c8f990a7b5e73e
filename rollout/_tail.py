"""Follow a rollout output while it is written: each record once, only whole lines.

The writer (:class:`~heddle.rollout._output.OutputSink`) appends one whole
line per ``os.write``, so a reader can see at most one line without its
newline: the one being written, or one torn by a crash. The tail reads up to
the last newline and leaves the rest for the next read. A restarted writer
cuts a torn last line off before it appends; that only removes bytes after
the last newline, which the tail never consumed. A file that shrinks below
what was read (replaced, or moved away and written anew) is read again from
the start, and records already yielded are skipped by their (task, sample).
Each record is checked with the reader ``heddle export`` uses, so a file that
is not a Heddle output stops the tail with one sentence.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from heddle.exceptions import OutputError

from ._export import check_record
from ._output import record_key

__all__ = ["RecordTail"]

_CHUNK = 1 << 20


class RecordTail:
    """The records appended to ``path`` since the last :meth:`read`, each exactly once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0  # bytes consumed: always just after a newline
        self._line = 0  # lines consumed, for messages
        self._seen: set[str] = set()

    @property
    def count(self) -> int:
        """Records yielded so far."""
        return len(self._seen)

    def read(self) -> list[dict[str, Any]]:
        """The new whole records (none while the file does not exist yet)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise OutputError(
                f"cannot read the rollout output {self.path}: {exc.strerror}"
            ) from exc
        try:
            if os.fstat(fd).st_size < self._offset:
                self._offset, self._line = 0, 0  # a new file: start over, skip what was yielded
            data = b""
            while chunk := os.pread(fd, _CHUNK, self._offset + len(data)):
                data += chunk
        finally:
            os.close(fd)
        end = data.rfind(b"\n") + 1
        records = []
        for line in data[:end].split(b"\n")[:-1]:
            self._line += 1
            if line.strip():
                record = self._parse(line)
                key = record_key(str(record["task_id"]), record["sample"])
                if key not in self._seen:
                    self._seen.add(key)
                    records.append(record)
        self._offset += end
        return records

    def _parse(self, line: bytes) -> dict[str, Any]:
        where = f"{self.path} line {self._line}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise OutputError(
                f"{where} is not JSON ({reason}); give a Heddle output file"
            ) from None
        check_record(record, where)
        assert isinstance(record, dict)  # check_record refuses anything else
        return record
