"""`heddle bench memory`: the session's memory per trajectory, in flight and once written.

What a session holds per unfinished trajectory is its token history (ids, mask,
logprobs: the recompute source and the record), its conversation and its
bookkeeping. This builds trajectories through the same ``TrajectoryRun.apply``
the session uses, from simulated steps (a tool reply, then generated tokens
with logprobs), and measures with ``tracemalloc``: bytes per trajectory while
in flight at 10K and 40K tokens, and what is left after its record is written.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import numpy as np

from heddle.rollout import SyntheticEnvironment, TrajectoryRun, load_workload, synthetic_tasks
from heddle.scheduler import Trajectory
from heddle.worker import StepReply

__all__ = ["bench_memory"]

_TURNS = 8
_TOOL_SHARE = 0.2  # of the context: tool replies (the coding workload's order)


def _reply(rng: np.random.Generator, appended: int, generated: int) -> StepReply:
    ids = rng.integers(0, 151_000, generated).tolist()  # a Qwen3-sized vocabulary
    return StepReply(
        appended_token_ids=rng.integers(0, 151_000, appended).tolist(),
        token_ids=ids,
        text="x" * (4 * generated),  # about four characters a token
        finish_reason="stop",
        prompt_tokens=0,
        cached_tokens=0,
        logprobs=rng.normal(-1.0, 0.5, generated).tolist(),
        queue_s=0.0,
        total_s=0.0,
    )


def _grow(run: TrajectoryRun, tokens: int, rng: np.random.Generator) -> None:
    per_turn = tokens // _TURNS
    tool = int(per_turn * _TOOL_SHARE)
    for _ in range(_TURNS):
        run.apply("worker-0", _reply(rng, tool, per_turn - tool), want_logprobs=True)


def _measure(count: int, tokens: int, seed: int) -> dict[str, float]:
    workload = load_workload("quickstart")
    tasks = synthetic_tasks(1, workload, seed)
    env = SyntheticEnvironment(workload, 1, count, seed=seed)
    rng = np.random.default_rng(seed)
    replies = [_reply(rng, 0, 0)]  # warm numpy and the allocator before measuring
    del replies
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    runs = []
    for sample in range(count):
        run = TrajectoryRun(
            Trajectory(f"t-{sample}", "g", prompt_tokens=0), tasks[0], 0, sample,
            env.episode(tasks[0], 0, sample, f"t-{sample}"),
        )  # fmt: skip
        _grow(run, tokens, rng)
        runs.append(run)
    gc.collect()
    in_flight = tracemalloc.get_traced_memory()[0] - base
    held = len(runs[0].tokens)
    for run in runs:
        run.forget_history()
    gc.collect()
    written = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {
        "tokens": float(held),
        "in_flight_bytes_per_trajectory": in_flight / count,
        "written_bytes_per_trajectory": written / count,
    }


def bench_memory(*, trajectories: int = 64, seed: int = 0) -> dict[str, Any]:
    """Bytes per trajectory at 10K and 40K tokens, in flight and after its record is written."""
    rows = {str(t): _measure(trajectories, t, seed) for t in (10_000, 40_000)}
    per_token = rows["40000"]["in_flight_bytes_per_trajectory"] / 40_000
    return {
        "trajectories": trajectories,
        "by_tokens": rows,
        "in_flight_bytes_per_token": per_token,
        # The paper's job: 8,192 trajectories of about 10K tokens, all in flight at once.
        "paper_job_in_flight_gib": 8192 * rows["10000"]["in_flight_bytes_per_trajectory"] / 2**30,
    }
