"""The output JSONL: one record per finished trajectory, never lost, never twice.

Each record is one ``os.write`` of a whole line to a file opened with
``O_APPEND``: once the call returns the line survives the process being
killed. ``fsync`` runs at most once a second and on close, which covers a
machine crash up to that second. On open, the records already there are the
trajectories a restarted session skips; a torn last line (the machine died
mid-write) is cut off and that trajectory runs again.

One session at a time: an exclusive ``flock`` on ``<output>.lock`` is held
from open to close, so a second run on the same output is refused instead of
writing every trajectory again. A file is repaired only once every complete
line has been read as a Heddle record: a file that is not an output is never
modified.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from heddle.exceptions import OutputError
from heddle.worker import _json

__all__ = ["OutputSink", "encode_record", "lock_path", "record_key"]

# Characters str.splitlines() (and older JavaScript) treat as line ends; JSON encoders
# leave them raw in strings, and a random-weight model emits them. In UTF-8 they only
# occur inside strings, where an escape means the same character.
_LINE_BREAKERS = (
    ("\u0085".encode(), b"\\u0085"),
    ("\u2028".encode(), b"\\u2028"),
    ("\u2029".encode(), b"\\u2029"),
)


def encode_record_bytes(record: Mapping[str, Any]) -> bytes:
    """One record as one JSON line (no newline) that every line-splitting reader sees as
    one line."""
    line = _json.dumps(record)
    for raw, escaped in _LINE_BREAKERS:
        if raw in line:
            line = line.replace(raw, escaped)
    return line


def encode_record(record: Mapping[str, Any]) -> str:
    """:func:`encode_record_bytes` as text."""
    return encode_record_bytes(record).decode()


log = logging.getLogger("heddle.output")
# How every record starts (the record's first key, compact); a torn tail must too.
_RECORD_HEAD = b'{"task_id":'
_RECORD_START = re.compile(rb'\{\s*"task_id"\s*:')
_FIX = "choose another spec.output.path (heddle run: --output)"


def record_key(task_id: str, sample: int) -> str:
    return f"{task_id}\x00{sample}"


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


class OutputSink:
    """Appends records to ``path``; :meth:`open` returns the keys already written."""

    def __init__(
        self, path: Path, *, fsync_interval_s: float = 1.0, follow_symlinks: bool = True
    ) -> None:
        self.path = path
        self.follow_symlinks = follow_symlinks
        # The operator passes False: its path was resolved inside the data root, so a
        # symlink there now was put in since, to redirect the writes elsewhere.
        self._nofollow = 0 if follow_symlinks else os.O_NOFOLLOW
        self.fsync_interval_s = fsync_interval_s
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._written: set[str] = set()
        self._last_sync = 0.0
        self.repaired_bytes = 0

    def open(self) -> set[str]:
        """Lock, read what is there, open for appending; a second call returns the same keys."""
        if self._fd is not None:
            return set(self._written)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(
                f"cannot create the output folder {self.path.parent}: {_reason(exc)}; {_FIX}"
            ) from exc
        self._lock()
        try:
            # One descriptor reads, repairs and appends: the file checked is the file written.
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | self._nofollow, 0o644)
        except OSError as exc:
            self._unlock()
            raise OutputError(
                f"cannot open the output {self.path}: {_reason(exc)}; {_FIX}"
            ) from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OutputError(f"the output {self.path} is not a regular file; {_FIX}")
            done = self._scan(fd)
        except BaseException:
            os.close(fd)
            self._unlock()
            raise
        self._fd = fd
        self._written = set(done)
        return done

    def _lock(self) -> None:
        where = lock_path(self.path)
        try:
            # O_NOFOLLOW: a symlink planted here must not make us truncate what it points to.
            fd = os.open(where, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise OutputError(
                f"cannot create the lock file {where}: {_reason(exc)}; {_FIX}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.read(fd, 32).decode("ascii", "replace").strip()
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise OutputError(f"cannot lock {where}: {_reason(exc)}; {_FIX}") from exc
            by = f" (pid {holder})" if holder.isdigit() else ""
            raise OutputError(
                f"the output {self.path} is in use by another Heddle session{by}; "
                f"wait for it to finish or {_FIX}"
            ) from exc
        with contextlib.suppress(OSError):  # the pid is a courtesy to the next one refused
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def _scan(self, fd: int) -> set[str]:
        # Line by line: a resumed 8,192 x 40K-token output is gigabytes, never held whole.
        done: set[str] = set()
        end = 0
        tail = b""
        with os.fdopen(os.dup(fd), "rb") as f:
            f.seek(0)
            for number, line in enumerate(f, start=1):  # binary lines end at b"\n" only
                if not line.endswith(b"\n"):
                    tail = line
                    break
                end += len(line)
                if not line.strip():
                    continue
                key = self._key(line)
                if key is None:
                    raise OutputError(
                        f"{self.path} line {number} is not a Heddle output record (expected a "
                        "JSON object with task_id and sample); move the file away, or fix that "
                        "line, and run again"
                    )
                if key in done:
                    log.warning(
                        "%s line %d repeats a trajectory already recorded", self.path, number
                    )
                done.add(key)
        if tail and not (_RECORD_START.match(tail) or _RECORD_HEAD.startswith(tail)):
            raise OutputError(
                f"{self.path} ends with a line that is not a Heddle output record; "
                f"move the file away and run again, or {_FIX}"
            )
        if tail:
            self.repaired_bytes = len(tail)
            log.warning(
                "%s ends with a torn record (%d bytes, a crash mid-write); cutting it off "
                "and running that trajectory again",
                self.path,
                self.repaired_bytes,
            )
            os.ftruncate(fd, end)
        return done

    @staticmethod
    def _key(line: bytes) -> str | None:
        try:
            record = _json.loads(line)
            sample = record["sample"]
            task_id = record["task_id"]
        except (ValueError, KeyError, TypeError):
            return None
        if isinstance(sample, bool) or not isinstance(sample, int):
            return None
        if not isinstance(task_id, str | int) or isinstance(task_id, bool):
            return None
        return record_key(str(task_id), sample)

    def write(self, record: Mapping[str, Any]) -> bool:
        """Append one record; ``False`` (and nothing written) if its key is already there.

        A write the disk refuses half-way (full, a file-size limit) is cut back to where
        the record began, so the file never holds a torn record, and raises OutputError.
        """
        if self._fd is None:
            raise RuntimeError("OutputSink.write before open()")
        key = record_key(str(record["task_id"]), int(record["sample"]))
        if key in self._written:
            return False
        line = encode_record_bytes(record) + b"\n"
        start = os.fstat(self._fd).st_size  # this session holds the lock: nobody else appends
        view = memoryview(line)
        try:
            while view:
                n = os.write(self._fd, view)
                if n == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[n:]
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
            raise OutputError(
                f"writing to the output {self.path} failed: {_reason(exc)}; the records "
                "written so far are kept: free space (or fix the path) and run again to resume"
            ) from exc
        self._written.add(key)
        now = time.monotonic()
        if now - self._last_sync >= self.fsync_interval_s:
            self._sync()
            self._last_sync = now
        return True

    def _sync(self) -> None:
        assert self._fd is not None
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise OutputError(f"syncing the output {self.path} failed: {_reason(exc)}") from exc

    @property
    def count(self) -> int:
        return len(self._written)

    def close(self) -> None:
        try:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise OutputError(f"closing the output {self.path} failed: {_reason(exc)}") from exc
        finally:
            self._unlock()
