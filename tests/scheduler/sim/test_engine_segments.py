"""A simulated engine's segments always make progress, speculation on or off between them.

Regression: after speculative segments the engine's clock is fractional, and a plain
segment (speculation turned off where it does not pay, or K 0 in a batch-size table)
whose first step ends within one iteration was planned with 0 iterations, forever (it
hung the co-location decision `heddle run` takes on a speculating pool).
"""

from __future__ import annotations

import itertools

from heddle.scheduler import ClusterSpec, Trajectory, TrajectoryScript
from heddle.scheduler.sim import SimEngine, SimTrajectory

_CLUSTER = ClusterSpec("one", 1, 1, "qwen3-8b", "h100-sxm", (1,), 1, batch_cap=8)


def _sim(tid: str, tokens: int) -> SimTrajectory:
    script = TrajectoryScript(tid, tid, 0, 100, (tokens,), (), (), ())
    sim = SimTrajectory(script, Trajectory(tid, tid, 100))
    sim.start_turn()
    return sim


def test_segments_progress_when_speculation_goes_off_on_a_fractional_clock() -> None:
    perf = _CLUSTER.perf_model()
    engine = SimEngine(perf.instance("e", 1), perf, lambda t: 0.0)
    # Speculating, then off: as a K-by-batch-size table or the pays-off check does.
    plans = itertools.chain([(2, 1.37)], itertools.repeat((0, 1.0)))
    engine.speculation = lambda _engine, _now: next(plans)
    # Both start on a whole clock; the short one ends the speculative segment, leaving
    # the clock at 3 x 1.37 = 4.11 and the long one's end 9.89 iterations away.
    sims = [_sim("long", 14), _sim("short", 3)]
    for sim in sims:
        engine.enqueue(sim, 0.0)
    now, segments = 0.0, 0
    while (end := engine.start_segment(now)) is not None:
        segments += 1
        assert segments < 10, "a segment made no progress"
        assert engine.segment is not None and engine.segment.iterations >= 1
        now = end
        engine.finish_segment(now)
    assert all(s.traj.generated_tokens == s.script.total_tokens for s in sims)
    assert segments == 2  # 3 speculative iterations, then the 10 plain ones left
