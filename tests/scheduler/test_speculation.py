"""Speculative decoding: exact drafters, replay, acceptance model, K policy, co-location."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from heddle.exceptions import ConfigError
from heddle.scheduler import (
    ACCEPTANCE_PRESETS,
    MODEL_PRESETS,
    HardwareSpec,
    PerfModel,
    ReplayConfig,
    ReplaySample,
    SeedQuery,
    SpeculationConfig,
    SuffixDrafter,
    SuffixIndex,
    accepted_prefix,
    choose_k,
    k_by_batch_size,
    ngram_draft,
    plan_group_colocation,
    replay_group,
    seed_text_pays,
    tokens_per_step,
    unseeded_history,
)

H100 = PerfModel(MODEL_PRESETS["qwen3-8b"], HardwareSpec("H100-SXM", 80.0, 3350.0, 989.0, 450.0))


# -- drafters ---------------------------------------------------------------------------------
def test_ngram_takes_the_longest_match_at_its_earliest_occurrence() -> None:
    # "1 2" occurs at 0 and 4; the 3-gram "4 1 2" does not occur earlier: n=2, first occurrence.
    assert ngram_draft([1, 2, 3, 4, 1, 2], k=3, min_n=1, max_n=3) == [3, 4, 1]
    # A longer match wins over an earlier shorter one.
    assert ngram_draft([7, 2, 9, 5, 7, 2, 8, 5, 7, 2], k=2, min_n=1, max_n=3) == [8, 5]
    # Fewer than k tokens follow the match: what there is.
    assert ngram_draft([5, 6, 5], k=4, min_n=1, max_n=2) == [6, 5]
    assert ngram_draft([1, 2, 3], k=4, min_n=2, max_n=3) == []


def test_suffix_index_follows_the_most_frequent_continuation() -> None:
    index = SuffixIndex(24)
    index.extend(0, [1, 2, 3, 1, 2, 4, 1, 2, 3])
    # "1 2" occurs 3 times (followed by 3, 4, 3): 3 with p=2/3; "1 2 3" twice, once followed
    # by 1: p=1/3. A 2-token match may propose 2 tokens (max_spec_factor 1).
    draft = index.speculate([1, 2], 8)
    assert draft.token_ids == (3, 1)
    assert draft.score == pytest.approx(2 / 3 + 1 / 3)
    # "2 3 1" occurs once: its continuation has p=1 all the way; 3 tokens for a 3-token match.
    assert index.speculate([5, 2, 3, 1], 8).token_ids == (2, 4, 1)
    # min_token_prob 0.1 stops a continuation whose estimated probability falls below it.
    rare = SuffixIndex(24)
    rare.extend(0, [1, 2] + [1, 9] * 11)
    assert rare.speculate([1], 4).token_ids == (9,)


def _naive_speculate(
    seqs: list[list[int]], pattern: list[int], max_spec: int, depth: int
) -> tuple[tuple[int, ...], float]:
    """Substring counting by brute force, with the suffix tree's rules."""
    pat = pattern[-depth:]
    best: tuple[tuple[int, ...], float] = ((), 0.0)
    for start in range(len(pat)):
        s = pat[start:]
        m = len(s)
        occ = [
            (i, j + m)
            for i, seq in enumerate(seqs)
            for j in range(len(seq) - m + 1)
            if seq[j : j + m] == s
        ]
        if not occ:
            continue
        tokens: list[int] = []
        prob, score, d = 1.0, 0.0, m
        while len(tokens) < min(max_spec, m) and d < depth:
            follow = [(seqs[i][e], (i, e)) for i, e in occ if e < len(seqs[i])]
            if not follow:
                break
            counts = Counter(t for t, _ in follow)
            top = max(counts.values())
            token = next(t for t, _ in follow if counts[t] == top)  # earliest occurrence
            if prob * top / len(occ) < 0.1:
                break
            prob *= top / len(occ)
            tokens.append(token)
            score += prob
            occ = [(i, e + 1) for t, (i, e) in follow if t == token]
            d += 1
        if score > best[1]:
            best = (tuple(tokens), score)
    return best


def test_suffix_index_matches_brute_force_counting() -> None:
    rng = random.Random(3)
    for _ in range(300):
        vocab = rng.choice([2, 3, 5])
        seqs = [[rng.randrange(vocab) for _ in range(rng.randint(1, 30))] for _ in range(3)]
        depth = rng.choice([3, 6, 24])
        index = SuffixIndex(depth)
        for i, seq in enumerate(seqs):
            index.extend(i, seq)
        pattern = [rng.randrange(vocab) for _ in range(rng.randint(1, 10))]
        k = rng.randint(1, 8)
        draft = index.speculate(pattern, k)
        tokens, score = _naive_speculate(seqs, pattern, k, depth)
        assert draft.token_ids == tokens
        assert draft.score == pytest.approx(score)


def test_suffix_drafter_prefers_the_shared_tree_only_when_it_scores_more() -> None:
    shared = SuffixIndex(24)
    shared.extend("sibling", [10, 11, 12, 13, 14])
    drafter = SuffixDrafter([1, 2, 10], shared)
    assert drafter.propose(4).token_ids == (11,)  # a 1-token match proposes 1 token
    drafter.append([11])
    assert drafter.propose(4).token_ids == (12, 13)
    assert SuffixDrafter([1, 2, 10], None).propose(4).token_ids == ()


def test_accepted_prefix_is_the_common_prefix() -> None:
    assert accepted_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert accepted_prefix([9], [1]) == 0
    assert accepted_prefix([1, 2], [1]) == 1


# -- replay -----------------------------------------------------------------------------------
def test_replay_counts_steps_exactly() -> None:
    # The output repeats the prompt: every draft from the prompt is right.
    prompt = tuple(range(100, 120))
    sample = ReplaySample("g", 0, prompt, prompt)
    (run,) = replay_group([sample], ReplayConfig("ngram", 4, "own", ngram_min=1, ngram_max=3))
    # Token 0 comes from the prefill; "100" then matches the prompt's start: 4 drafts accepted
    # per step (+1 sampled) until the end.
    assert run.output_tokens == 20
    assert sum(run.emitted) == 19
    assert run.emitted[0] == 5
    assert tokens_per_step([run]) == pytest.approx(19 / len(run.emitted))
    # Random text with nothing to draft from: one token per step.
    rng = random.Random(0)
    noise = tuple(rng.randrange(10**6) for _ in range(30))
    (plain,) = replay_group([ReplaySample("g", 0, (1, 2), noise)], ReplayConfig("suffix", 4))
    assert plain.emitted == [1] * 29


def test_siblings_help_only_with_text_that_exists_then() -> None:
    text = tuple(range(200, 260))
    a = ReplaySample("g", 0, (1,), text)
    b = ReplaySample("g", 1, (1,), text)
    own = replay_group([a, b], ReplayConfig("suffix", 8, "own"))
    together = replay_group([a, b], ReplayConfig("suffix", 8, "siblings"))
    # Alone, nothing repeats; side by side both write the same text at the same pace, so
    # neither is ahead of the other enough to draft much: the gain is bounded.
    assert tokens_per_step(own) == pytest.approx(1.0)
    assert tokens_per_step(together) < 2.0
    # From history (the same text, finished earlier) drafts run ahead: K+1 per step.
    hist = replay_group([a], ReplayConfig("suffix", 8, "history"), history=[b])
    assert tokens_per_step(hist) > 6.0


# -- acceptance model, K policy, co-location ------------------------------------------------
def test_presets_order_sources_and_grow_with_k() -> None:
    model = ACCEPTANCE_PRESETS["default"]
    own = model.tokens_per_step("suffix", 4)
    siblings = model.tokens_per_step("suffix", 4, siblings=15)
    history = model.tokens_per_step("suffix", 4, siblings=15, history=16)
    assert 1.0 < own < siblings < history
    assert model.tokens_per_step("suffix", 2) < own < model.tokens_per_step("suffix", 8)
    assert model.tokens_per_step("off", 4) == 1.0
    pessimistic = ACCEPTANCE_PRESETS["pessimistic"]
    assert pessimistic.tokens_per_step("suffix", 4) == pytest.approx(1.14)
    assert pessimistic.tokens_per_step("suffix", 4, siblings=15) == pytest.approx(1.29)
    assert pessimistic.tokens_per_step("ngram", 4) == pytest.approx(1.11)


def test_verification_costs_compute_for_every_query_token() -> None:
    # Memory-bound at batch 1: verifying 4 drafts costs almost nothing more.
    one = H100.iteration_time(1, 8192, 4)
    assert H100.iteration_time(1, 8192, 4, draft_tokens=4) < one * 1.05
    # At 256 sequences of 1K the compute of 5 query tokens each dominates.
    full = H100.iteration_time(256, 256 * 1024, 1)
    assert H100.iteration_time(256, 256 * 1024, 1, draft_tokens=4) > full * 1.5
    # With GQA, attention reads 4 flops per KV byte per query: long contexts stay
    # memory-bound, so verification is nearly free there even at a large batch.
    long = H100.iteration_time(64, 64 * 32768, 1)
    assert H100.iteration_time(64, 64 * 32768, 1, draft_tokens=4) < long * 1.1
    # The segment sum stays exact with speculation (context grows by batch * tau per step).
    seg = H100.segment_time(8, 8 * 4096, 2, 10, draft_tokens=3, tokens_per_step=1.7)
    steps = sum(H100.iteration_time(8, 8 * 4096 + i * 8 * 1.7, 2, 3) for i in range(10))
    assert seg == pytest.approx(steps)


def test_k_is_off_where_verification_is_compute_bound_and_on_in_the_tail() -> None:
    model = ACCEPTANCE_PRESETS["pessimistic"]

    def tau(k: int) -> float:
        return model.tokens_per_step("suffix", k, siblings=15)

    assert choose_k(H100, 1, 256, 256 * 512, tau) == 0
    assert choose_k(H100, 4, 2, 2 * 8192, tau) > 0
    table = k_by_batch_size(H100, 1, 512, tau, max_batch=256)
    assert table[0][1] > 0  # small batches speculate
    assert table[-1] == (256, 0)  # full batches do not
    assert [b for b, _ in table] == sorted(b for b, _ in table)
    # Never slower: wherever K > 0 the model's tokens per second beat plain decode.
    for up_to, k in table:
        if k:
            t0 = H100.iteration_time(up_to, up_to * 512, 1)
            assert tau(k) / H100.iteration_time(up_to, up_to * 512, 1, k) > 1.0 / t0


def test_colocation_pays_for_balanced_groups_not_for_one_giant_group() -> None:
    even = {f"g{i}": [1000.0] * 16 for i in range(32)}
    plan = plan_group_colocation(even, 16, 0.01, 1.6, 1.2)
    assert plan.colocate
    assert Counter(plan.assignment.values()) == Counter({e: 2 for e in range(16)})
    # One group holds almost all the work: on one engine it becomes the tail.
    skewed = {"giant": [50_000.0] * 16, **{f"g{i}": [10.0] * 16 for i in range(31)}}
    assert not plan_group_colocation(skewed, 16, 0.01, 1.6, 1.2).colocate
    # No acceptance gain from siblings: scattering is never worse.
    assert not plan_group_colocation(even, 16, 0.01, 1.2, 1.2).colocate


def test_an_engine_holds_the_pools_share_of_a_tasks_earlier_samples_uninserted() -> None:
    # The previous iteration put a task's 16 samples somewhere among the engines, not
    # remembered: 1 per engine on 16, a quarter on 64, whether this group is whole or not.
    assert unseeded_history(16, 16) == 1.0
    assert unseeded_history(16, 64) == 0.25
    assert unseeded_history(16, 0) == 16.0  # no engine known: the whole group is the pool
    # The model is linear in history below its measured count, so a fractional
    # expectation is the mean of "all of them one time in E, none otherwise".
    model = ACCEPTANCE_PRESETS["default"]
    own = model.tokens_per_step("suffix", 2)
    full = model.tokens_per_step("suffix", 2, history=16)
    assert model.tokens_per_step("suffix", 2, history=0.25) == pytest.approx(
        own + (full - own) / 64
    )


def test_inserting_a_tasks_history_pays_against_what_the_engine_holds_uninserted() -> None:
    # A whole group of 16 mid-output on one engine: its siblings are there; its earlier
    # samples are there only by the pool's share (here 1 of 16 engines' worth).
    model = ACCEPTANCE_PRESETS["default"]

    def tau(k: int, siblings: int, history: float) -> float:
        return model.tokens_per_step("suffix", k, siblings=siblings, history=history)

    def query(unseeded: float) -> SeedQuery:
        return SeedQuery(
            tp=1, batch=16, context_tokens=16 * 2000.0, k=2, insert_tokens=16 * 1000.0,
            members=16, remaining_tokens=16 * 4000.0, siblings_held=15, siblings_after=15,
            history_after=16, history_unseeded=unseeded,
        )  # fmt: skip

    assert seed_text_pays(H100, query(1.0), tau)
    # Were the earlier answers all held already (as if the routing remembered the
    # group's home), the same insertion would add nothing.
    assert not seed_text_pays(H100, query(16.0), tau)


def test_speculation_config_rejects_unknown_settings() -> None:
    with pytest.raises(ConfigError, match="not one of off, ngram, suffix"):
        SpeculationConfig("eagle", 4)
    with pytest.raises(ConfigError, match="between 1 and 16"):
        SpeculationConfig("suffix", 0)
    assert SpeculationConfig("suffix", None).label() == "suffix-kauto"
