"""The reshape planner: what to create, drain and delete, never above the GPU budget."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.operator import DECISIONS_KEPT, OwnWrites, PodView, kept_decisions, pool_actions
from heddle.scheduler import PoolShape


def _pods(*specs: tuple[str, int, str]) -> list[PodView]:
    return [PodView(name, tp, phase) for name, tp, phase in specs]


def test_empty_pool_creates_the_shape_largest_tp_first() -> None:
    actions = pool_actions("p", [], PoolShape.of({2: 1, 1: 2}), 4, set())
    assert actions.create == [("p-tp2-0", 2), ("p-tp1-0", 1), ("p-tp1-1", 1)]
    assert not actions.drain and not actions.delete


def test_reshape_drains_first_and_creates_only_within_budget() -> None:
    pods = _pods(("p-tp1-0", 1, "Ready"), ("p-tp1-1", 1, "Ready"), ("p-tp1-2", 1, "Ready"),
                 ("p-tp1-3", 1, "Ready"))  # fmt: skip
    target = PoolShape.of({2: 1, 1: 2})
    first = pool_actions("p", pods, target, 4, set())
    assert first.drain == ["p-tp1-3", "p-tp1-2"]  # newest first
    assert first.create == [] and first.blocked_gpus == 2  # 4 GPUs still held
    draining = [PodView(p.name, 1, "Draining", draining=p.name in first.drain) for p in pods]
    second = pool_actions("p", draining, target, 4, {"p-tp1-3"})
    assert second.delete == ["p-tp1-3"] and second.create == []  # p-tp1-3 holds its GPU until gone
    gone = [p for p in draining if p.name != "p-tp1-3"]
    third = pool_actions("p", gone, target, 4, {"p-tp1-2"})
    assert third.delete == ["p-tp1-2"] and third.create == []
    last = pool_actions("p", [p for p in gone if p.name != "p-tp1-2"], target, 4, set())
    assert last.create == [("p-tp2-0", 2)]


def test_failed_instance_is_deleted_and_replaced_when_budget_frees() -> None:
    pods = _pods(("p-tp1-0", 1, "Ready"), ("p-tp1-1", 1, "Failed"))
    actions = pool_actions("p", pods, PoolShape.of({1: 2}), 2, set())
    assert actions.delete == ["p-tp1-1"] and actions.create == []
    actions = pool_actions("p", pods[:1], PoolShape.of({1: 2}), 2, set())
    assert actions.create == [("p-tp1-1", 1)]


def test_rolling_update_one_outdated_instance_at_a_time() -> None:
    pods = [PodView(f"p-tp1-{i}", 1, "Ready", outdated=True) for i in range(3)]
    actions = pool_actions("p", pods, PoolShape.of({1: 3}), 3, set())
    assert actions.drain == ["p-tp1-0"]
    busy = [PodView("p-tp1-0", 1, "Draining", draining=True), *pods[1:]]
    assert pool_actions("p", busy, PoolShape.of({1: 3}), 3, set()).drain == []


@settings(max_examples=200)
@given(
    current=st.lists(st.sampled_from([1, 2, 4]), max_size=8),
    target=st.dictionaries(st.sampled_from([1, 2, 4]), st.integers(0, 4), max_size=3),
    budget=st.integers(1, 16),
    failed=st.integers(0, 3),
)
def test_never_plans_above_the_budget(
    current: list[int], target: dict[int, int], budget: int, failed: int
) -> None:
    pods = [
        PodView(f"p-tp{tp}-{i}", tp, "Failed" if i < failed else "Ready")
        for i, tp in enumerate(current)
    ]
    held = sum(p.tp for p in pods)
    actions = pool_actions("p", pods, PoolShape.of(target), budget, set())
    new = sum(tp for _, tp in actions.create)
    assert new == 0 or held + new <= budget  # created only while everything that exists fits
    assert len({n for n, _ in actions.create} | {p.name for p in pods}) == len(
        actions.create
    ) + len(pods)


def _pod(name: str, rv: str, **annotations: str) -> dict[str, object]:
    return {"metadata": {"name": name, "resourceVersion": rv, "annotations": annotations}}


def test_own_writes_stand_in_for_the_index_until_the_watch_delivers_them() -> None:
    writes = OwnWrites()
    index = [_pod("a", "1"), _pod("b", "2")]
    writes.note(None, _pod("c", "3"), "c")  # created; the index has not seen it yet
    writes.note(index[0], _pod("a", "4", draining="true"), "a")  # annotated
    writes.note(index[1], None, "b")  # deleted
    view = {p["metadata"]["name"]: p["metadata"] for p in writes.over(index)}
    assert view["c"]["resourceVersion"] == "3"
    assert view["a"]["annotations"] == {"draining": "true"}
    assert view["b"].get("deletionTimestamp")  # terminating: its GPUs still count
    # The watch catches up: the index's newer versions win and the entries go.
    caught_up = [_pod("a", "5", draining="true"), _pod("c", "6")]
    view = {p["metadata"]["name"]: p["metadata"] for p in writes.over(caught_up)}
    assert {n: m["resourceVersion"] for n, m in view.items()} == {"a": "5", "c": "6"}
    assert writes.entries == {}


def test_own_writes_give_up_standing_in_after_their_wait() -> None:
    writes = OwnWrites(wait_s=0.0)
    writes.note(None, _pod("c", "3"), "c")
    assert writes.over([]) == [] and writes.entries == {}


def test_a_pool_keeps_its_latest_decisions_one_per_key() -> None:
    def record(key: str) -> dict[str, str]:
        return {"key": key, "policy": "heddle"}

    body = {"status": {"decisions": [record("b"), "not a record", record("a"), record("c")]}}
    # The latest first; its key's older record gone; what is not a record dropped.
    assert kept_decisions(body, record("a")) == [record("a"), record("b"), record("c")]
    assert kept_decisions({}, record("a")) == [record("a")]
    many = {"status": {"decisions": [record(str(i)) for i in range(10)]}}
    kept = kept_decisions(many, record("new"))
    assert len(kept) == DECISIONS_KEPT and kept[:2] == [record("new"), record("0")]
