"""Texts a worker's engine drafts from besides its own requests: the drafting corpus.

vLLM's suffix cache is per engine, so a group's siblings that ran on other engines,
or the same task's outputs in earlier iterations, are texts this engine lacks. The
session sends them (``POST /v1/drafts``); the worker remembers which it has inserted,
a bounded number per job and task, so a text is inserted once, and forgets them with
the job's contexts (``DELETE /v1/trajectories?job=``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = ["MAX_DRAFT_TEXTS_PER_TASK", "DraftHistory"]

MAX_DRAFT_TEXTS_PER_TASK: Final = 64  # a GRPO group or two, and a few iterations of it


@dataclass
class DraftHistory:
    """Which texts were inserted, by (job, task), oldest first, at most ``per_task`` each."""

    per_task: int = MAX_DRAFT_TEXTS_PER_TASK
    _held: dict[tuple[str, str], OrderedDict[str, None]] = field(default_factory=dict)

    def new(
        self, job: str, task: str, texts: Sequence[Sequence[int]]
    ) -> list[tuple[str, list[int]]]:
        """The texts not inserted yet, each with its key; remembers them (oldest forgotten)."""
        held = self._held.setdefault((job, task), OrderedDict())
        out = []
        for text in texts:
            digest = hashlib.blake2b(repr(list(text)).encode(), digest_size=12).hexdigest()
            if digest in held or not text:
                continue
            held[digest] = None
            if len(held) > self.per_task:
                held.popitem(last=False)
            out.append((f"{job}/{task}/{digest}", list(text)))
        return out

    def held(self, job: str, task: str) -> int:
        return len(self._held.get((job, task), ()))

    def purge(self, job: str) -> int:
        gone = [k for k in self._held if k[0] == job]
        for k in gone:
            del self._held[k]
        return len(gone)
