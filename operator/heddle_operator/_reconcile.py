"""What an EnginePool's pods should do next: a pure decision over the pods as they are.

The rules (docs/operator.md, "Reshaping"):

1. A failed instance is deleted, and replaced like any missing one.
2. Instances beyond the desired shape are marked draining; the session moves
   their trajectories off during tool calls; a draining instance is deleted
   once it is empty (or its drain timed out).
3. Missing instances are created, largest TP first, only while the GPUs of
   every pod that still exists (terminating and draining included) plus the
   new one fit the budget. So the budget holds at every moment.
4. With the shape complete, one instance of an outdated spec (image, model,
   vLLM args) at a time is drained and replaced: a rolling update.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from heddle.api import InstancePhase
from heddle.scheduler import PoolShape

from ._builders import instance_name

__all__ = ["PodView", "PoolActions", "pool_actions"]


@dataclass(frozen=True)
class PodView:
    name: str
    tp: int
    phase: InstancePhase  # builders.pod_phase
    terminating: bool = False
    draining: bool = False
    outdated: bool = False

    @property
    def active(self) -> bool:
        return not (self.terminating or self.draining or self.phase == InstancePhase.FAILED)


@dataclass
class PoolActions:
    create: list[tuple[str, int]] = field(default_factory=list)
    drain: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why, for events and logs
    blocked_gpus: int = 0  # GPUs of missing instances that wait for others to go

    @property
    def empty(self) -> bool:
        return not (self.create or self.drain or self.delete)


def pool_actions(
    pool: str,
    pods: list[PodView],
    desired: PoolShape,
    gpu_budget: int,
    drained: set[str],
) -> PoolActions:
    """Actions for this reconcile round; ``drained`` names draining pods safe to delete now."""
    actions = PoolActions()
    for pod in pods:
        if pod.terminating:
            continue
        if pod.phase == InstancePhase.FAILED:
            actions.delete.append(pod.name)
            actions.notes.append(f"instance {pod.name} failed; replacing it")
        elif pod.draining and pod.name in drained:
            actions.delete.append(pod.name)
            actions.notes.append(f"instance {pod.name} is drained; deleting it")
    want = desired.as_dict()
    active = [p for p in pods if p.active]
    have = Counter(p.tp for p in active)
    for tp, count in sorted(have.items()):
        surplus = count - want.get(tp, 0)
        if surplus <= 0:
            continue
        # Drain the least useful first: not ready yet, then the newest.
        ranked = sorted(
            (p for p in active if p.tp == tp),
            key=lambda p: (p.phase == InstancePhase.READY, -_index(p.name)),
        )
        for pod in ranked[:surplus]:
            actions.drain.append(pod.name)
            actions.notes.append(f"draining {pod.name}: the shape wants {want.get(tp, 0)}x TP{tp}")
    draining_now = set(actions.drain)
    settled = all(have.get(tp, 0) == want.get(tp, 0) for tp in set(have) | set(want)) and not any(
        p.draining or p.terminating for p in pods
    )
    if settled:
        outdated = sorted((p for p in active if p.outdated), key=lambda p: p.name)
        if outdated:
            actions.drain.append(outdated[0].name)
            draining_now.add(outdated[0].name)
            actions.notes.append(f"rolling {outdated[0].name} to the new spec")
    # GPUs held by every pod that still exists, deleted-this-round ones included.
    used = sum(p.tp for p in pods)
    names = {p.name for p in pods}
    still = Counter(p.tp for p in active if p.name not in draining_now)
    for tp in sorted(want, reverse=True):
        for _ in range(want[tp] - still.get(tp, 0)):
            if used + tp > gpu_budget:
                actions.blocked_gpus += tp
                continue
            index = 0
            while instance_name(pool, tp, index) in names:
                index += 1
            name = instance_name(pool, tp, index)
            names.add(name)
            used += tp
            actions.create.append((name, tp))
    if actions.blocked_gpus:
        actions.notes.append(
            f"{actions.blocked_gpus} GPUs of new instances wait for draining ones to go "
            f"(budget {gpu_budget})"
        )
    return actions


def _index(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0
