"""Heddle's speculation decisions for a run: whether to keep GRPO groups whole.

Co-locating a group puts its siblings' text in one engine's suffix tree, and
makes whole groups the unit of placement: a long group on one engine becomes
the tail, and a group-keeping placement replaces the routing the pool would
otherwise run (verl's pinning, slime's least-load at every step). The closed
form (:func:`plan_group_colocation`) sees the first and not the second: at
8,192 trajectories on 64 GPUs it predicted co-location 30% ahead on search and
math, and the runs came out 28% and 17% behind the best baseline
(docs/speculation.md). So the decision here compares the plan against the
routing it would replace, *with speculation*, on a simulation of the pool:

1. Where the closed form predicts no gain, refused — unless the session seeds
   the siblings' texts into every engine that runs a group member
   (``seed_siblings``): then a scattered group drafts from its siblings too,
   at the cost of the insertions, which the closed form does not weigh, so
   only the simulation below decides.
2. The simulation runs the whole pool where it is no larger than the shape
   planner's replica (sim/_plan.py), else one replica of it: 1/scale of the
   GPUs running every scale-th group by length, each whole
   (:func:`~._plan.group_replica`), at a quarter of the cost on the paper's
   pool, as the shape planner judges shapes. A replica keeps per-engine
   effects, not all cross-engine ones; for co-location with the tail spilled
   (:class:`~._speculation.GroupStickyPlacement`) its lead came out within a
   point of the pool's or below it in all eight runs at 8,192 trajectories on
   64 GPUs (docs/speculation.md), so it asks the whole pool's margin, not the
   shape planner's 10% for a replica.
3. On that pool, the workload sketch (the previous rollout, or the
   predictor's prior: never the run's true lengths) runs under the routing in
   effect and Heddle's speculation, scattered and co-located; co-location is
   taken only if it finishes sooner by ``margin``. Where the run seeds texts
   (siblings, history), the co-located sketch runs once more without seeding,
   and the faster of the two is the co-located candidate (a tie drops
   seeding: a group's own engine holds its siblings' texts already, and the
   insertions cost engine time). The verdict says which (``seed``). The two
   candidates are often within a percent or two, which is where a run's
   makespan moves with where the groups land, so this choice is one draw on
   the sketch (docs/speculation.md). The sketch's runs predict
   with the run's predictor (``judge_colocation``): the seeding gate reads
   the predictions.

The live session (rollout/_colocation.py) and the simulator both call
:func:`decide_colocation` through ``judge_colocation`` (sim/_simulator.py), which
passes in the simulation it needs (``simulate``), so this module runs nothing
itself and imports no simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from .._speculation import plan_group_colocation
from ._minis import Wave

__all__ = [
    "COLOCATION_MARGIN",
    "ColocationDecision",
    "decide_colocation",
]

# How much sooner the co-located simulation must finish, on the whole pool or a replica
# of it: the simulated lead of a placement over the routing it replaces was 7-16 points
# too high at 2,048 trajectories (sim/_plan.py); co-location's own, measured apart at
# 8,192 with the tail spilled, was at most 1.0 point too high (docs/speculation.md).
COLOCATION_MARGIN: Final = 0.05


@dataclass(frozen=True)
class ColocationDecision:
    """The verdict and why (for the report)."""

    colocate: bool
    reason: str
    predicted_scattered_s: float = 0.0
    predicted_colocated_s: float = 0.0
    # Co-located, whether the run still seeds texts (False: the co-located sketch ran
    # no slower without); True where groups are not kept whole (seeding as configured).
    seed: bool = True
    # Its simulations as they ran: what deciding cost, charged before the run starts.
    waves: tuple[Wave, ...] = ()

    @property
    def simulated_events(self) -> int:
        """Events its simulations handled (their CPU)."""
        return sum(sum(w.events) for w in self.waves)


def decide_colocation(
    groups: Mapping[str, Sequence[float]],
    engines: int,
    seconds_per_token: float,
    tokens_per_step_colocated: float,
    tokens_per_step_scattered: float,
    *,
    siblings_seeded: bool,
    simulate: Callable[[Sequence[tuple[bool, bool]]], list[float]] | None,
    replica: int = 1,
    seeds: bool | None = None,
    margin: float = COLOCATION_MARGIN,
) -> ColocationDecision:
    """Whether Heddle keeps GRPO groups whole on one engine (module docstring).

    ``groups``: predicted remaining tokens per trajectory, by group;
    ``tokens_per_step_*``: the acceptance a request gets with its whole group in its
    engine's tree and with the share the pool's routing leaves it;
    ``simulate([(colocate, seed), ...])`` the simulated makespans of the workload sketch
    under the pool's routing with speculation, groups kept whole or not, texts seeded
    as the run configures or not at all, run side by side where the runner can (None:
    no simulation available, refuse); ``replica``:
    the pool is that many copies of what ``simulate`` runs (1: the whole pool);
    ``seeds``: whether the run seeds any text (siblings or history; default
    ``siblings_seeded``); ``margin``: how much sooner co-located must finish.
    """
    seeds = siblings_seeded if seeds is None else seeds
    closed = plan_group_colocation(
        groups, engines, seconds_per_token, tokens_per_step_colocated, tokens_per_step_scattered
    )
    figures = (
        f"closed form {closed.predicted_colocated_s:.0f}s co-located at "
        f"{tokens_per_step_colocated:.2f} tokens/step vs {closed.predicted_scattered_s:.0f}s "
        f"scattered at {tokens_per_step_scattered:.2f}"
    )
    if siblings_seeded:
        # Seeded, a scattered group drafts from its siblings too, at the cost of the
        # insertions, which the closed form does not see: only a simulation can say.
        figures = "siblings seeded: the closed form cannot weigh the insertions"
    elif not closed.colocate:
        return ColocationDecision(False, f"off ({figures})")
    if simulate is None:
        return ColocationDecision(
            False, f"off (no simulation of this pool or a replica of it; {figures})"
        )
    # One wave: the routing's run, co-located, and (where the run seeds) co-located
    # without seeding.
    asked = [(False, True), (True, True)] + ([(True, False)] if seeds else [])
    found = simulate(asked)
    scattered, colocated = found[0], found[1]
    seed, how = True, ""
    if seeds:
        seeded, plain = colocated, found[2]
        seed = seeded < plain
        colocated = min(seeded, plain)
        how = (
            f" with seeding ({plain:.0f}s without)"
            if seed
            else f" without seeding ({seeded:.0f}s with)"
        )
    take = colocated < scattered * (1.0 - margin)
    where = f" on a 1/{replica} replica" if replica > 1 else ""
    verdict = "on" if take else "off"
    return ColocationDecision(
        take,
        f"{verdict} (simulated {colocated:.0f}s co-located{how} vs {scattered:.0f}s under "
        f"the pool's routing{where}, margin {margin:.0%}; {figures})",
        scattered,
        colocated,
        seed or not take,
    )
