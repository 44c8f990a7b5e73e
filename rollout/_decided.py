"""The start-up decisions, kept so that a job with the same inputs reuses them.

A session decides its pool's shape and routing (the shape planner) and whether GRPO
groups stay whole (the co-location verdict) by mini-simulations of what it expects of
the job (rollout/_prior.py: the pool's previous rollout, or the predictor's prior where
there is none): 5-30 s at the paper's scale, during which no step is routed. They read
nothing else an iteration changes (its new weights reach no decision). So a session
records its decisions under a key of everything they read (:func:`decision_inputs`,
the previous rollout's records exactly; the prompts by their mean length, within 5%:
:func:`prompts_match`), and a later session whose key matches takes them instead of
simulating again: the next iteration of a trainer's in-process loop, decided ahead on
this rollout (rollout/_run.py, ``decide_ahead``), or a job run again on the same
previous rollout (docs/speculation.md, "Decisions kept under a key of their inputs").

Kept where the next session finds them: under ``.heddle/decisions`` for ``heddle run``
(:class:`DecisionCache`), in the EnginePool's ``status.decisions`` on a cluster (the
operator copies it from the job's status). What is read back is untrusted: a record
that is malformed, or names a shape its pool cannot run, is set aside with one
sentence in the log, and the session decides afresh.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, TypeGuard

import heddle.scheduler as scheduler_package
import heddle.worker as worker_package
from heddle.exceptions import ConfigError, HeddleError
from heddle.scheduler import PerfModel, PoolShape, get_policy
from heddle.worker import Speculation

from ._colocation import ColocationVerdict
from ._job import LocalJob
from ._previous import read_state, state_dir, write_state
from ._prior import prompt_tokens

__all__ = [
    "AHEAD_WAIT_LIMIT_S",
    "DECISIONS_DIR",
    "DECISIONS_FORMAT",
    "DecidedRun",
    "DecisionCache",
    "PoolPlan",
    "decision_inputs",
    "decision_key",
    "mean_prompt_tokens",
    "prompts_match",
    "read_decided",
]

log = logging.getLogger("heddle.run")

DECISIONS_FORMAT = "heddle.decisions/v1"
PENDING_FORMAT = "heddle.decisions-pending/v1"
DECISIONS_DIR = Path(".heddle/decisions")  # under a session pod's data root (its volume)
# A session waits at most this long for decisions another process announced it is taking
# ahead (a marker left by a process that was killed promises no more than this).
AHEAD_WAIT_LIMIT_S = 600.0
_POLL_S = 0.2
# Prompts are not in the key: the next iteration's batch differs in content, not in what
# the sketch does with it. A record is taken where the prompts' mean length is within this
# of the one it was decided on (a grid would split iterations at its steps).
PROMPT_TOLERANCE = 0.05
DECISION_BYTES = 1 << 20  # a kept record is a few hundred bytes: read no more


@dataclass(frozen=True)
class PoolPlan:
    """What the shape planner decided: the shape, and how to schedule on it.

    ``policy`` is the job's policy, or the step-centric policy the planner fell
    back to where trajectory scheduling was predicted not to help (then with its
    in-flight cap, ``max_trajectories_in_flight`` over the whole pool).
    """

    shape: PoolShape
    policy: str
    max_trajectories_in_flight: int | None = None


@dataclass(frozen=True)
class DecidedRun:
    """A session's start-up decisions and what they were decided on.

    ``key``: :func:`decision_key` of the inputs; ``decided_s``: the seconds deciding took
    when it was done; ``prompt_mean_tokens``: the prompts' mean length it was done on;
    ``reused``: taken from an earlier session with the same key, or decided ahead for
    this one (this session spent only ``waited_s`` on them).
    """

    key: str
    plan: PoolPlan
    colocation: ColocationVerdict | None
    decided_s: float
    prompt_mean_tokens: float = 0.0  # what the decisions were taken on (prompts_match)
    reused: bool = field(default=False, compare=False)
    # How long this session waited for decisions taken ahead for it (not yet done; then
    # reused, or decided afresh where they were taken on other prompts).
    waited_s: float = field(default=0.0, compare=False)

    @property
    def took_s(self) -> float:
        """What deciding cost this session: where the decisions were reused, only the wait
        for them (their deciding ahead still running when it started)."""
        return self.waited_s if self.reused else self.decided_s + self.waited_s

    def as_dict(self) -> dict[str, Any]:
        """The record as kept (summary.json's ``decisions``, the pool's status.decisions)."""
        plan = self.plan
        out: dict[str, Any] = {
            "format": DECISIONS_FORMAT,
            "key": self.key,
            "shape": [{"tp": tp, "replicas": n} for tp, n in plan.shape.counts],
            "policy": plan.policy,
            "decidedSeconds": round(self.decided_s, 3),
            "promptMeanTokens": round(self.prompt_mean_tokens, 3),
            "reused": self.reused,  # by the session that wrote it (read back: ignored)
        }
        # Absent rather than null where not decided (the CRDs' status schemas).
        if plan.max_trajectories_in_flight is not None:
            out["maxTrajectoriesInFlight"] = plan.max_trajectories_in_flight
        if self.colocation is not None:
            out["colocation"] = self.colocation.as_dict()
        return out


def mean_prompt_tokens(local: LocalJob) -> float:
    """The job's prompts' mean length in tokens, as the sketch counts them."""
    prompts = [prompt_tokens(task) for task in local.tasks.tasks]
    return sum(prompts) / len(prompts) if prompts else 0.0


def prompts_match(decided: DecidedRun, local: LocalJob) -> bool:
    """Whether ``decided`` was decided on prompts of about ``local``'s mean length."""
    now, then = mean_prompt_tokens(local), decided.prompt_mean_tokens
    return abs(now - then) <= PROMPT_TOLERANCE * max(now, then, 1.0)


def decision_inputs(
    local: LocalJob, perf: PerfModel, speculation: Speculation | None = None
) -> dict[str, Any]:
    """Everything the shape planner and the co-location verdict read, as plain data:
    the job's limits, policy and group size, its tasks' number, the synthetic workload's
    tools, the pool, its speculation, the performance model, the decision code itself,
    and the previous rollout. Not the prompts' length, which a record carries instead
    (:func:`prompts_match`)."""
    job, pool = local.job, local.pool
    tools: list[Any] = []
    if local.workload is not None:
        tools = [repr(t) for t in local.workload.tools]
    return {
        "code": _code_digest(),
        "policy": job.policy,
        "samples_per_task": job.samples_per_task,
        "max_total_tokens": job.sampling.max_total_tokens,
        "max_turns": job.max_turns,
        "tasks": len(local.tasks.tasks),
        "tools": tools,
        "pool": {
            "gpus": pool.gpus,
            "gpus_per_node": pool.gpus_per_node,
            "tensor_parallel_sizes": list(pool.tensor_parallel_sizes),
            "shape": None if pool.shape is None else str(pool.shape),
            "model": pool.model,
        },
        "speculation": repr(speculation or pool.speculation),
        "perf": repr(perf),
        # The previous rollout the sketch is made of (rollout/_previous.py), exactly.
        "history": hashlib.sha256(repr(local.history).encode()).hexdigest(),
    }


def decision_key(local: LocalJob, perf: PerfModel, speculation: Speculation | None = None) -> str:
    """A digest of :func:`decision_inputs`: equal keys, equal decisions."""
    text = json.dumps(decision_inputs(local, perf, speculation), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@cache
def _code_digest() -> str:
    """The decision code's source (the scheduler and rollout packages, and the worker's
    speculation modules the verdict reads its acceptance from): a changed Heddle decides
    again rather than reuse an older one's answer."""
    files = sorted(Path(scheduler_package.__file__).parent.rglob("*.py"))
    files += sorted(Path(__file__).parent.glob("*.py"))
    files += sorted(Path(worker_package.__file__).parent.glob("*speculation*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def read_decided(data: Any, local: LocalJob, where: str) -> DecidedRun:
    """A kept record, checked as untrusted input: its fields' types, a known policy, and
    a shape that fits the pool (budget, nodes, allowed TP sizes); raises
    :class:`ConfigError` with one sentence naming ``where`` and what is wrong."""
    if not isinstance(data, Mapping) or data.get("format") != DECISIONS_FORMAT:
        raise ConfigError(f"{where}: not a decisions record (expected format {DECISIONS_FORMAT})")
    key, policy, cap = data.get("key"), data.get("policy"), data.get("maxTrajectoriesInFlight")
    entries, decided = data.get("shape"), data.get("decidedSeconds")
    if not isinstance(key, str) or not isinstance(policy, str):
        raise ConfigError(f"{where}: 'key' and 'policy' must be strings")
    if not isinstance(entries, list) or not all(
        isinstance(e, Mapping) and _count(e.get("tp")) and _count(e.get("replicas"))
        for e in entries
    ):
        raise ConfigError(f"{where}: 'shape' must be a list of {{tp, replicas}} counts")
    if cap is not None and not _count(cap):
        raise ConfigError(f"{where}: 'maxTrajectoriesInFlight' must be a positive count")
    if not _seconds(decided):
        raise ConfigError(f"{where}: 'decidedSeconds' must be a number of seconds")
    prompts = data.get("promptMeanTokens")
    if not _seconds(prompts):
        raise ConfigError(f"{where}: 'promptMeanTokens' must be a number of tokens")
    pool = local.pool
    try:
        get_policy(policy)  # one sentence listing the policies if unknown
        shape = PoolShape.of({int(e["tp"]): int(e["replicas"]) for e in entries})
        shape.validate(pool.gpus, pool.gpus_per_node, pool.tensor_parallel_sizes)
    except HeddleError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if pool.shape is not None and shape != pool.shape:
        raise ConfigError(f"{where}: shape {shape} is not the pool's pinned {pool.shape}")
    plan = PoolPlan(shape, policy, cap)
    return DecidedRun(key, plan, _verdict(data, where), float(decided), float(prompts))


def _seconds(value: Any) -> TypeGuard[float]:
    """A finite number at least 0 (seconds, or a mean in tokens)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and 0 <= value < float("inf")
    )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _verdict(data: Mapping[str, Any], where: str) -> ColocationVerdict | None:
    c = data.get("colocation")
    if c is None:
        return None
    if not (
        isinstance(c, Mapping)
        and isinstance(c.get("colocate"), bool)
        and isinstance(c.get("reason"), str)
        and isinstance(c.get("seed", True), bool)
    ):
        raise ConfigError(f"{where}: 'colocation' must be {{colocate, reason, seed}}")
    return ColocationVerdict(c["colocate"], c["reason"], c.get("seed", True))


class DecisionCache:
    """``heddle run``'s kept decisions: one JSON file per key in ``folder`` (default:
    ``.heddle/decisions``, or under ``$HEDDLE_STATE_DIR``); ``reuse``
    False (``--fresh-decisions``): nothing is read back, what is decided is kept."""

    def __init__(self, folder: Path | None = None, *, reuse: bool = True) -> None:
        self.folder = folder if folder is not None else state_dir("decisions")
        self.reuse = reuse

    def get(self, key: str, local: LocalJob) -> DecidedRun | None:
        """The record kept under ``key``, or None (none kept, or one set aside as bad)."""
        path = self.folder / f"{key}.json"
        if not self.reuse:
            return None
        try:
            text = read_state(path, DECISION_BYTES)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("decisions %s not read (%s); deciding afresh", path, exc.strerror)
            return None
        try:
            data = json.loads(text)
        except ValueError as exc:
            log.warning("decisions %s are not JSON (%s); deciding afresh", path, exc)
            return None
        try:
            found = read_decided(data, local, str(path))
        except ConfigError as exc:
            log.warning("%s; deciding afresh", str(exc).split("\n", 1)[0])
            return None
        return found if found.key == key else None

    def _pending(self, key: str) -> Path:
        return self.folder / f"{key}.pending"

    def announce(self, key: str, expected_s: float) -> None:
        """Say that the decisions under ``key`` are being taken ahead and should be kept
        within ``expected_s`` seconds (at most :data:`AHEAD_WAIT_LIMIT_S`): a session in
        another process with that key waits for them (:meth:`wait`) rather than decide
        the same again. :meth:`settle` takes the word back."""
        until = time.time() + min(max(expected_s, 0.0), AHEAD_WAIT_LIMIT_S)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_state(self._pending(key), json.dumps({"format": PENDING_FORMAT, "until": until}))
        except OSError as exc:  # no session will wait: it decides itself, as before
            log.warning("decisions ahead not announced in %s (%s)", self.folder, exc.strerror)

    def settle(self, key: str) -> None:
        """The decisions announced under ``key`` are kept, or will not be."""
        with contextlib.suppress(OSError):
            self._pending(key).unlink()

    def pending_until(self, key: str) -> float | None:
        """When decisions announced under ``key`` should be kept (epoch seconds), or None
        where none are announced, or the marker is not one (it is untrusted: a shared
        volume's; read as a bounded regular file, its time at most the limit away)."""
        try:
            data = json.loads(read_state(self._pending(key), DECISION_BYTES))
        except (OSError, ValueError):
            return None
        if not isinstance(data, Mapping) or data.get("format") != PENDING_FORMAT:
            return None
        until = data.get("until")
        if not _seconds(until):
            return None
        return float(min(until, time.time() + AHEAD_WAIT_LIMIT_S))

    def wait(self, key: str) -> float:
        """Wait while decisions under ``key`` are announced and not yet kept, until the
        time they promised (at most :data:`AHEAD_WAIT_LIMIT_S`); the seconds waited."""
        if not self.reuse:
            return 0.0
        started = time.monotonic()
        deadline, slept = started + AHEAD_WAIT_LIMIT_S, False
        while not (self.folder / f"{key}.json").exists():
            until = self.pending_until(key)
            if until is None:
                break
            left = min(until - time.time(), deadline - time.monotonic())
            if left <= 0:
                break
            time.sleep(min(_POLL_S, left))
            slept = True
        return time.monotonic() - started if slept else 0.0

    def put(self, decided: DecidedRun) -> None:
        """Keep ``decided`` (written whole, then renamed: a reader never sees half)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{decided.key}.json"
            write_state(path, json.dumps(decided.as_dict(), indent=1) + "\n")
        except OSError as exc:  # a read-only folder costs the next run its decisions only
            log.warning("decisions not kept in %s (%s)", self.folder, exc.strerror)
