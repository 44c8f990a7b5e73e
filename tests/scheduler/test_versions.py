"""Weight-version age in priority, placement and the trainer's take (scheduler/_versions.py)."""

from __future__ import annotations

from heddle.scheduler import (
    VERSION_AGE_STEP,
    FCFSOrdering,
    ProgressivePriority,
    VersionAgedOrdering,
    aged_priority,
    engine_priority,
    get_policy,
    kv_voided,
    take_oldest,
    unpinned,
    version_age,
)

from ._trajectories import make


def test_age_counts_pushes_since_the_first_token_and_nothing_before_it() -> None:
    assert version_age(0, 2) == 2
    assert version_age(2, 2) == 0
    assert version_age(None, 3) == 0  # no token yet (or no known version): not old
    assert version_age(3, 2) == 0  # started while the newer weights were loading


def test_the_oldest_version_runs_first_then_the_base_ordering() -> None:
    started = {"short-old": 0, "long-new": 1, "longer-new": 1, "none-yet": None}
    ordering = VersionAgedOrdering(ProgressivePriority(), lambda t: version_age(started[t.id], 1))
    trajs = [
        make("long-new", 30_000),
        make("none-yet", 40_000),
        make("short-old", 10),
        make("longer-new", 35_000),
    ]
    order = [t.id for t in sorted(trajs, key=ordering.priority)]
    # Progressive alone would put short-old last; its age puts it first, and the rest keep
    # progressive's order (longest predicted remaining first).
    assert order == ["short-old", "none-yet", "longer-new", "long-new"]
    assert [t.id for t in sorted(trajs, key=ProgressivePriority().priority)][-1] == "short-old"
    fcfs = VersionAgedOrdering(FCFSOrdering(), lambda t: version_age(started[t.id], 1))
    late_old, early_new = make("short-old", 1, ready=9.0), make("long-new", 1, ready=1.0)
    assert sorted([early_new, late_old], key=fcfs.priority) == [late_old, early_new]


def test_ages_stay_apart_in_the_integer_priority_vllm_takes() -> None:
    # The widest base a job can have (a whole context budget of remaining tokens) never
    # bridges one version of age, and 21 versions fit a signed 32-bit priority.
    worst_young = engine_priority(aged_priority(-1_000_000.0, 0))
    best_old = engine_priority(aged_priority(0.0, 1))
    assert best_old < worst_young
    ranks = [engine_priority(aged_priority(-40_960.0, age)) for age in range(22)]
    assert ranks == sorted(ranks, reverse=True) and len(set(ranks)) == 22
    assert VERSION_AGE_STEP * 21 < 2**31


def test_a_load_unpins_only_contexts_whose_kv_came_from_older_weights() -> None:
    assert kv_voided(0, 1) and not kv_voided(1, 1) and not kv_voided(None, 1)
    assert unpinned("e0", 0, 1) is None  # routed as a new trajectory
    assert unpinned("e0", 1, 1) == "e0"  # its KV is current: it stays
    assert unpinned("e0", None, 1) == "e0"  # no version known (no spec.weights)


def test_heddle_is_the_policy_that_ages() -> None:
    assert get_policy("heddle").version_age
    assert not any(get_policy(n).version_age for n in ("verl", "verl-star", "slime", "fcfs"))


def test_the_take_is_oldest_version_first_and_completion_order_among_equals() -> None:
    # Groups in completion order with their oldest version's place (lower is older).
    versions = [2, 0, 1, 0, 2, 1]
    assert take_oldest(versions, 3) == [1, 3, 2]  # both place-0 groups, as they completed
    assert take_oldest(versions, 6) == [1, 3, 2, 5, 0, 4]
    assert take_oldest(versions, 10) == [1, 3, 2, 5, 0, 4]  # n past what finished: all
    assert take_oldest(versions, 0) == [] and take_oldest([], 2) == []
    # One version throughout (a job without pushes): completion order exactly.
    assert take_oldest([3, 3, 3, 3], 3) == [0, 1, 2]
