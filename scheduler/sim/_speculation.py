"""Speculative decoding in the simulator: what each engine's drafts are worth.

Only what a real vLLM worker can do is modelled: one method per engine
(``ngram`` or ``suffix``), K fixed or chosen by batch size, no per-request switch.
An engine's suffix tree holds the text of every request it served (vLLM keeps
up to 10,000 responses), so a request's siblings help only where they ran on the
same engine — for the baselines as for Heddle. The previous iteration's samples
of a task are taken to be on an engine in the same number as this iteration's
(the same routing ran then), so history too follows placement.

Each segment (``SimEngine.start_segment``) asks :class:`EngineSpeculator` for the
batch's K and tokens per step; every running request then advances by the
batch's mean tokens per step (a fluid approximation within one engine: the
engine's throughput is exact for the model, the order in which its requests
finish is averaged).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .._perf import PerfModel
from .._placement import ClusterView, StickyPlacement
from .._speculation import (
    AcceptanceModel,
    SpeculationConfig,
    choose_k,
    plan_group_colocation,
)
from .._types import Trajectory
from ._entities import SimEngine

__all__ = [
    "EngineSpeculator",
    "GroupStickyPlacement",
    "SimSpeculation",
    "attach",
    "colocation_placement",
]


@dataclass(frozen=True)
class SimSpeculation:
    """A run's speculation: the engines' config, the acceptance model, and whether
    Heddle's placement may co-locate GRPO groups (decided per run)."""

    config: SpeculationConfig
    acceptance: AcceptanceModel
    colocate_groups: bool = False


class EngineSpeculator:
    """``(K, tokens per step)`` for an engine's running batch; tracks what each engine served."""

    def __init__(self, spec: SimSpeculation, perf: PerfModel) -> None:
        self.spec = spec
        self.perf = perf
        # engine -> group -> trajectories whose text is in that engine's suffix tree
        self.served: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self.k_steps: Counter[int] = Counter()  # segments started at each K (reports)
        self._tau: dict[tuple[int, int, int, float], float] = {}  # memo of the model

    def _tokens_per_step(self, k: int, siblings: int, history: int, position: float) -> float:
        key = (k, siblings, history, position)
        value = self._tau.get(key)
        if value is None:
            value = self.spec.acceptance.tokens_per_step(
                self.spec.config.method, k, siblings=siblings, history=history, position=position
            )
            self._tau[key] = value
        return value

    def __call__(self, engine: SimEngine) -> tuple[int, float]:
        config = self.spec.config
        if not config.enabled or not engine.running:
            return 0, 1.0
        served = self.served[engine.name]
        running = engine.running.values()
        for sim in running:
            served[sim.traj.group_id].add(sim.id)
        # Requests that draft alike, counted once each: (siblings, history, position bucket).
        kinds: Counter[tuple[int, int, float]] = Counter()
        for sim in running:
            here = len(served[sim.traj.group_id])
            kinds[(here - 1, here, _position(sim.traj))] += 1
        batch = len(engine.running)

        def tau(k: int) -> float:
            total = 0.0
            for (siblings, history, position), n in kinds.items():
                total += n * self._tokens_per_step(k, siblings, history, position)
            return total / batch

        if config.num_speculative_tokens is None:
            k = choose_k(self.perf, engine.instance.tp, batch, engine.running_context, tau)
        else:
            k = config.num_speculative_tokens
        self.k_steps[k] += 1
        return (k, tau(k)) if k else (0, 1.0)


def _position(traj: Trajectory) -> float:
    """The request's output position, rounded to a power of two (few distinct kinds)."""
    n = traj.generated_tokens
    return float(1 << max(n, 1).bit_length()) if n > 0 else 0.0


class GroupStickyPlacement(StickyPlacement):
    """verl's sticky placement with GRPO groups kept whole: a trajectory's first step
    goes where its group's first went (the least loaded engine for a new group),
    so the group's text shares one suffix tree and its prompt one prefix cache."""

    name = "group-sticky"

    def __init__(self, assignment: Mapping[str, str] | None = None) -> None:
        self._group_engine: dict[str, str] = dict(assignment or {})

    def first_step(self, trajectory: Trajectory, view: ClusterView) -> str:
        engine = self._group_engine.get(trajectory.group_id)
        if engine is None or not view.has(engine):
            engine = view.least_loaded()
            self._group_engine[trajectory.group_id] = engine
        return engine


def attach(engines: Iterable[SimEngine], speculator: EngineSpeculator | None) -> None:
    for engine in engines:
        engine.speculation = speculator


def colocation_placement(
    trajectories: list[Trajectory],
    engines: list[SimEngine],
    spec: SimSpeculation,
    perf: PerfModel,
) -> tuple[GroupStickyPlacement | None, str]:
    """Heddle's decision (:func:`plan_group_colocation`) on the predictor's lengths:
    a group-keeping placement and ``"on"``, or None and ``"off"`` with the figures."""
    groups: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        groups[t.group_id].append(max(1.0, t.predicted_remaining_tokens))
    model, config = spec.acceptance, spec.config
    k = config.num_speculative_tokens or 4  # the decision's reference K for ``auto``
    size = max(len(v) for v in groups.values())
    per_engine = max(1, len(engines))
    scattered = max(0, round(size / per_engine) - 1)
    co = model.tokens_per_step(config.method, k, siblings=size - 1, history=size)
    sc = model.tokens_per_step(config.method, k, siblings=scattered, history=scattered + 1)
    tp = engines[0].instance.tp
    per_token = perf.instance("probe", tp).per_token_s
    plan = plan_group_colocation(groups, per_engine, per_token, co, sc)
    verdict = (
        f"{'on' if plan.colocate else 'off'} (predicted {plan.predicted_colocated_s:.0f}s "
        f"co-located at {co:.2f} tokens/step vs {plan.predicted_scattered_s:.0f}s scattered "
        f"at {sc:.2f})"
    )
    if not plan.colocate:
        return None, verdict
    # The decision is the plan's; where each group goes is decided when its first
    # trajectory starts (the least loaded engine then), which follows the real load
    # rather than the predicted one.
    return GroupStickyPlacement(), verdict
