"""The cluster as placement sees it, kept up to date as engine loads change.

The simulator used to build a fresh :class:`ClusterView` (a list and a dict over
every engine) for each dispatch, and ``least_loaded`` scanned every engine: O(E)
per step, so O(trajectories × engines) per rollout, quadratic when both grow
with the cluster. Here the view is built once and engines report each change of
their load, which costs O(log E); ``least_loaded`` is O(1), ``has`` a set lookup.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from .._placement import ClusterView

if TYPE_CHECKING:
    from ._entities import SimEngine

__all__ = ["LiveClusterView", "LoadIndex"]


class LoadIndex:
    """Argmin of (load, position) over n slots, and the largest load, under point updates.

    A segment tree over keys ``load * width + position`` (one integer comparison
    breaks ties toward the earliest position, as ``min`` over a list does), plus a
    count per load value for the maximum. Loads must be non-negative integers.
    """

    def __init__(self, loads: Sequence[int]) -> None:
        n = len(loads)
        if n == 0:
            raise ValueError("LoadIndex needs at least one slot")
        width = 1
        while width < n:
            width *= 2
        self.width = width
        self._loads = list(loads)
        empty = 1 << 62  # padding slots never win
        tree = [empty] * (2 * width)
        for pos, load in enumerate(loads):
            tree[width + pos] = load * width + pos
        for i in range(width - 1, 0, -1):
            tree[i] = min(tree[2 * i], tree[2 * i + 1])
        self._tree = tree
        self._count: dict[int, int] = {}
        for load in loads:
            self._count[load] = self._count.get(load, 0) + 1
        self._max = max(loads)

    def set(self, pos: int, load: int) -> None:
        old = self._loads[pos]
        if load == old:
            return
        self._loads[pos] = load
        tree, i = self._tree, self.width + pos
        tree[i] = load * self.width + pos
        i //= 2
        while i:
            tree[i] = min(tree[2 * i], tree[2 * i + 1])
            i //= 2
        count = self._count
        count[old] -= 1
        count[load] = count.get(load, 0) + 1
        self._max = max(self._max, load)
        while not count.get(self._max):  # loads move by small steps: amortised O(1)
            self._max -= 1

    def argmin(self) -> int:
        """Position of the smallest load; the earliest position among equals."""
        return self._tree[1] % self.width

    def min(self) -> int:
        return self._tree[1] // self.width

    def max(self) -> int:
        return self._max

    def load(self, pos: int) -> int:
        return self._loads[pos]


class _Loads(Mapping[str, int]):
    """Engine name -> current load, read through the index (a live mapping)."""

    def __init__(self, position: Mapping[str, int], index: LoadIndex) -> None:
        self._position = position
        self._index = index

    def __getitem__(self, name: str) -> int:
        return self._index.load(self._position[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._position)

    def __len__(self) -> int:
        return len(self._position)


class LiveClusterView(ClusterView):
    """A :class:`ClusterView` of the simulator's engines whose loads stay current.

    Same answers as a view built from scratch at the same moment; the engine list
    is fixed (the simulator never drains an engine mid-run).
    """

    _index: LoadIndex
    _position: dict[str, int]
    _names: list[str]

    def __init__(self, engines: Sequence[SimEngine]) -> None:
        position = {e.name: pos for pos, e in enumerate(engines)}
        index = LoadIndex([e.load for e in engines])
        super().__init__([e.instance for e in engines], _Loads(position, index))
        # A frozen dataclass: extra attributes go through object.__setattr__.
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_position", position)
        object.__setattr__(self, "_names", [e.name for e in engines])

    def update(self, engine: SimEngine) -> None:
        """The engine's load changed."""
        pos = self._position.get(engine.name)
        if pos is not None:
            self._index.set(pos, engine.load)

    def names(self) -> list[str]:
        return list(self._names)

    def least_loaded(self) -> str:
        return self._names[self._index.argmin()]

    def has(self, name: str | None) -> bool:
        return name is not None and name in self._position

    def load_range(self) -> tuple[int, int]:
        return self._index.min(), self._index.max()
