"""The output JSONL: one record per finished trajectory, never lost, never twice.

Each record is one ``os.write`` of a whole line to a file opened with
``O_APPEND``: once the call returns the line survives the process being
killed. ``fsync`` runs at most once a second and on close, which covers a
machine crash up to that second. On open, the records already there are the
trajectories a restarted session skips; a torn last line (the machine died
mid-write) is cut off and that trajectory runs again.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from heddle.exceptions import ConfigError

__all__ = ["OutputSink", "record_key"]

log = logging.getLogger("heddle.output")


def record_key(task_id: str, sample: int) -> str:
    return f"{task_id}\x00{sample}"


class OutputSink:
    """Appends records to ``path``; :meth:`open` returns the keys already written."""

    def __init__(self, path: Path, *, fsync_interval_s: float = 1.0) -> None:
        self.path = path
        self.fsync_interval_s = fsync_interval_s
        self._fd: int | None = None
        self._written: set[str] = set()
        self._last_sync = 0.0
        self.repaired_bytes = 0

    def open(self) -> set[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        done = self._scan()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._written = set(done)
        return done

    def _scan(self) -> set[str]:
        if not self.path.exists():
            return set()
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            self.repaired_bytes = len(data) - end
            log.warning(
                "%s ends with a torn record (%d bytes, a crash mid-write); cutting it off "
                "and running that trajectory again",
                self.path,
                self.repaired_bytes,
            )
            with self.path.open("r+b") as f:
                f.truncate(end)
        done: set[str] = set()
        for number, line in enumerate(data[:end].splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                key = record_key(str(record["task_id"]), int(record["sample"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(
                    f"{self.path} line {number} is not a Heddle output record ({exc}); "
                    "move the file away or fix that line, then run again"
                ) from exc
            if key in done:
                log.warning("%s line %d repeats a trajectory already recorded", self.path, number)
            done.add(key)
        return done

    def write(self, record: Mapping[str, Any]) -> bool:
        """Append one record; ``False`` (and nothing written) if its key is already there."""
        if self._fd is None:
            raise RuntimeError("OutputSink.write before open()")
        key = record_key(str(record["task_id"]), int(record["sample"]))
        if key in self._written:
            return False
        line = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        view = memoryview(line)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self._written.add(key)
        now = time.monotonic()
        if now - self._last_sync >= self.fsync_interval_s:
            os.fsync(self._fd)
            self._last_sync = now
        return True

    @property
    def count(self) -> int:
        return len(self._written)

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
