"""Offline predictor quality: Pearson and tail recall after step k.

:func:`evaluate_predictor` replays a workload in *token time*: every
trajectory advances at the same rate, so when one has generated ``g`` tokens,
a sibling whose total is below ``g`` has finished and the others are
running with ``g`` tokens so far. The predictor sees exactly that
information (through its public API) at each step boundary. The simulator
reports the same metrics from the schedule it actually ran.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ._predictor import LengthPredictor
from ._stats import pearson, tail_recall
from ._types import FinishedTrajectory, Trajectory, TrajectoryState
from ._workload import TrajectoryScript

__all__ = ["PredictorQuality", "evaluate_predictor", "history_of"]


@dataclass(frozen=True)
class PredictorQuality:
    """Prediction of total length after ``step`` LLM steps.

    ``all``: every trajectory (those already finished are known exactly);
    ``alive``: only trajectories still running after the step: the harder set.
    """

    step: int
    pearson_all: float
    tail_recall_all: float
    pearson_alive: float
    tail_recall_alive: float
    alive: int
    total: int


def history_of(scripts: Iterable[TrajectoryScript]) -> list[FinishedTrajectory]:
    """Finished records of a (previous) rollout, to seed a predictor."""
    return [
        FinishedTrajectory(
            s.group_id,
            s.prompt_tokens,
            s.total_tokens,
            s.turns,
            s.turn_tokens,
            s.tool_output_tokens,
            s.tool_latency_s,
        )
        for s in scripts
    ]


def evaluate_predictor(
    scripts: Sequence[TrajectoryScript],
    predictor: LengthPredictor,
    steps: Sequence[int] = (1, 2, 4),
) -> list[PredictorQuality]:
    """Replay ``scripts`` through ``predictor``; score its predictions at ``steps``."""
    trajs = [Trajectory(s.id, s.group_id, s.prompt_tokens) for s in scripts]
    boundaries = [np.cumsum(s.turn_tokens).tolist() for s in scripts]
    wanted = set(steps)
    predicted: dict[int, dict[int, float]] = {k: {} for k in steps}
    events = [(boundaries[i][0], 1, i) for i in range(len(scripts))]
    heapq.heapify(events)
    for t in trajs:
        predictor.observe(t)
    while events:
        tokens, turn, i = heapq.heappop(events)
        traj, script = trajs[i], scripts[i]
        traj.generated_tokens, traj.turns = int(tokens), turn
        traj.turn_tokens.append(script.turn_tokens[turn - 1])
        if turn == script.turns:
            traj.state = TrajectoryState.DONE
            predictor.finish(traj)
            continue
        traj.tool_calls = turn
        traj.state = TrajectoryState.IN_TOOL
        prediction = predictor.update(traj)
        if turn in wanted:
            predicted[turn][i] = prediction.total_tokens
        heapq.heappush(events, (boundaries[i][turn], turn + 1, i))

    truth = np.array([s.total_tokens for s in scripts], dtype=np.float64)
    results = []
    for k in steps:
        alive = sorted(predicted[k])
        everything = truth.copy()  # finished by step k: known exactly
        for i, value in predicted[k].items():
            everything[i] = value
        alive_pred = np.array([predicted[k][i] for i in alive])
        alive_true = truth[alive] if alive else np.array([])
        results.append(
            PredictorQuality(
                step=k,
                pearson_all=pearson(everything, truth),
                tail_recall_all=tail_recall(everything, truth),
                pearson_alive=pearson(alive_pred, alive_true),
                tail_recall_alive=tail_recall(alive_pred, alive_true),
                alive=len(alive),
                total=len(scripts),
            )
        )
    return results
