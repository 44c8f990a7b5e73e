"""The pool's previous rollout: what the next session's predictor and decisions start from.

The simulator's Heddle runs seed their predictor with the previous rollout and plan
the pool's shape and co-location on it (docs/simulator.md); without it the session
starts from the predictor's prior, a long-tailed guess that can be far from the job
(docs/speculation.md, "Without the previous rollout": flat ran at 0.69x of its figure
with it). So each session keeps its finished trajectories' lengths per pool, and the
next session on that pool reads them back (``LocalJob.history``).

Kept as ``FOLDER/POOL.json``: ``.heddle/history`` for ``heddle run`` and the Python
client, ``.heddle/history`` under the data root on a session pod (the job's own
volume; ``NAMESPACE.POOL.json``). Only lengths are kept (prompt, per-turn output and
tool replies, in tokens), never text. What is read back is untrusted: a file that is
malformed or out of bounds is set aside with one sentence in the log, and the session
starts from the prior.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from heddle.exceptions import ConfigError
from heddle.scheduler import FinishedTrajectory

from ._output_record import TrajectoryStatus
from ._record import TrajectoryRun

__all__ = [
    "HISTORY_DIR",
    "HISTORY_FORMAT",
    "MAX_HISTORY_RECORDS",
    "STATE_DIR_ENV",
    "PreviousRollouts",
    "finished_records",
    "read_history",
    "read_state",
    "state_dir",
    "write_state",
]

log = logging.getLogger("heddle.run")

HISTORY_FORMAT = "heddle.previous-rollout/v1"
# What a session keeps for the next one (previous rollouts, decisions): under this folder
# of the working directory, or HEDDLE_STATE_DIR's.
STATE_DIR_ENV = "HEDDLE_STATE_DIR"
HISTORY_DIR = Path(".heddle/history")


def state_dir(name: str) -> Path:
    """``name`` under the state folder: ``$HEDDLE_STATE_DIR/name``, else ``.heddle/name``."""
    return Path(os.environ.get(STATE_DIR_ENV) or ".heddle") / name


def read_state(path: Path, max_bytes: int) -> str:
    """A kept file's text: a regular file of at most ``max_bytes``, never through a link (a
    shared volume's link to a FIFO or a device would hang the session, to another file
    mislead it). Raises FileNotFoundError, or OSError with ``strerror`` saying why not."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"over {max_bytes} bytes")
        return f.read(max_bytes + 1).decode("utf-8", errors="replace")


def write_state(path: Path, text: str) -> None:
    """Write ``path`` whole, then rename it in place (a reader never sees half): into a new
    file of this process's own, never through a link put where it goes."""
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    with os.fdopen(os.open(partial, flags, 0o644), "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(partial, path)


MAX_HISTORY_RECORDS = 65_536  # trajectories kept: the paper's 8,192 eight times over
MAX_TURNS = 1_024  # per record; a longer trajectory's turns are summed into its last
MAX_TOKENS = 1 << 24  # per number: no context is longer
MAX_BYTES = 64 << 20  # per file: read no more, keep the newest records that fit


def finished_records(runs: Iterable[TrajectoryRun]) -> list[FinishedTrajectory]:
    """The records the predictor learns from, of the runs that did not fail and generated:
    their prompt, each turn's output, each tool reply's tokens and latency."""
    out: list[FinishedTrajectory] = []
    for run in runs:
        t = run.traj
        if run.status == TrajectoryStatus.FAILED or t.generated_tokens < 1 or t.turns < 1:
            continue
        record = FinishedTrajectory(
            t.group_id, t.prompt_tokens, t.generated_tokens, t.turns,
            tuple(t.turn_tokens), tuple(run.tool_output_tokens),
        )  # fmt: skip
        out.append(record)
    return out


def read_history(data: Any, where: str) -> list[FinishedTrajectory]:
    """Records kept by :meth:`PreviousRollouts.put`, checked as untrusted; raises
    :class:`ConfigError` with one sentence naming ``where`` and what is wrong."""
    if not isinstance(data, Mapping) or data.get("format") != HISTORY_FORMAT:
        raise ConfigError(f"{where}: not a previous rollout (expected format {HISTORY_FORMAT})")
    rows = data.get("records")
    if not isinstance(rows, list) or len(rows) > MAX_HISTORY_RECORDS:
        raise ConfigError(f"{where}: 'records' must be a list of at most {MAX_HISTORY_RECORDS}")
    out: list[FinishedTrajectory] = []
    for i, row in enumerate(rows):
        record = _record(row)
        if record is None:
            raise ConfigError(
                f"{where}: record {i} must be [group, prompt, output, turns, [turn outputs], "
                f"[tool replies]] with counts below {MAX_TOKENS}"
            )
        out.append(record)
    return out


def _record(row: Any) -> FinishedTrajectory | None:
    if not isinstance(row, list) or len(row) != 6 or not isinstance(row[0], str):
        return None
    group, prompt, total, turns, turn_tokens, tools = row
    counts = (prompt, total, turns)
    if not all(_count(c) for c in counts) or total < 1 or turns < 1 or turns > MAX_TURNS:
        return None
    if not isinstance(turn_tokens, list) or not isinstance(tools, list):
        return None
    if len(turn_tokens) > MAX_TURNS or len(tools) > MAX_TURNS:
        return None
    if not all(_count(c) for c in (*turn_tokens, *tools)):
        return None
    return FinishedTrajectory(group[:256], prompt, total, turns, tuple(turn_tokens), tuple(tools))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_TOKENS


def _row(r: FinishedTrajectory) -> list[Any]:
    turns = list(r.turn_tokens)
    if len(turns) > MAX_TURNS:  # the tail's turns summed into the last kept one
        turns = [*turns[: MAX_TURNS - 1], sum(turns[MAX_TURNS - 1 :])]
    tools = list(r.tool_output_tokens)[:MAX_TURNS]
    clip = MAX_TOKENS - 1
    return [r.group_id, min(r.prompt_tokens, clip), min(r.total_tokens, clip),
            min(r.turns, MAX_TURNS), [min(t, clip) for t in turns],
            [min(t, clip) for t in tools]]  # fmt: skip


class PreviousRollouts:
    """The previous rollout per pool, one JSON file each in ``folder`` (default:
    ``.heddle/history``, or under ``$HEDDLE_STATE_DIR``)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder if folder is not None else state_dir("history")

    def _path(self, pool: str) -> Path:
        return self.folder / f"{pool}.json"

    def get(self, pool: str) -> tuple[FinishedTrajectory, ...]:
        """Pool ``pool``'s previous rollout; empty where none was kept or it was bad."""
        path = self._path(pool)
        try:
            text = read_state(path, MAX_BYTES)
        except FileNotFoundError:
            return ()
        except OSError as exc:
            log.warning("previous rollout %s not read (%s); starting from the prior", path,
                        exc.strerror)  # fmt: skip
            return ()
        try:
            return tuple(read_history(json.loads(text), str(path)))
        except ValueError as exc:  # not JSON (a ValueError), or a ConfigError (one too)
            said = str(exc).split("\n", 1)[0]
            if not isinstance(exc, ConfigError):
                said = f"{path} is not JSON ({said})"
            log.warning("%s; starting from the prior", said)
            return ()

    def put(self, pool: str, records: Sequence[FinishedTrajectory]) -> None:
        """Keep ``records`` (the newest :data:`MAX_HISTORY_RECORDS`) as the pool's previous
        rollout, written whole then renamed; nothing where the rollout finished none."""
        if not records:
            return
        rows = [_row(r) for r in records[-MAX_HISTORY_RECORDS:]]
        text = json.dumps({"format": HISTORY_FORMAT, "records": rows}, separators=(",", ":"))
        while len(text) > MAX_BYTES:  # many long agentic trajectories: the newest that fit
            rows = rows[len(rows) // 2 :]
            text = json.dumps({"format": HISTORY_FORMAT, "records": rows}, separators=(",", ":"))
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_state(self._path(pool), text + "\n")
        except OSError as exc:  # the next session starts from the prior, nothing else
            log.warning("previous rollout not kept in %s (%s)", self.folder, exc.strerror)
