"""The n-gram drafter against vLLM's own proposer function (no engine is started)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from heddle.scheduler import ngram_draft

# Importing vLLM (torch, numba) costs seconds on an idle machine and over a minute on a busy one.
pytestmark = pytest.mark.slow


def test_ngram_draft_equals_vllms_proposer() -> None:
    proposer = pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")
    vllm_draft = proposer._find_longest_matched_ngram_and_propose_tokens
    rng = random.Random(0)
    for _ in range(3000):
        context = [rng.randrange(rng.choice([2, 3, 5, 20])) for _ in range(rng.randint(1, 60))]
        min_n = rng.randint(1, 4)
        max_n = rng.randint(min_n, 6)
        k = rng.randint(1, 8)
        theirs = vllm_draft(np.array(context, dtype=np.int32), min_n, max_n, 10**6, k)
        assert ngram_draft(context, k, min_n, max_n) == [int(t) for t in theirs]
