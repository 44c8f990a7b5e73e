"""Draft-token proposers that replay exactly what vLLM's would propose.

Drafts from n-gram matching and suffix trees carry no probabilities, so under
rejection sampling a draft token is accepted iff it equals the token the target
model samples at that position. Replaying a recorded output against these
drafters therefore gives the exact number of tokens each decode step would have
produced (docs/speculation.md). Two proposers, with vLLM 0.32's semantics:

* :func:`ngram_draft` – vLLM's ``ngram`` method (``prompt_lookup_min/max``):
  the longest suffix of the context, ``min_n..max_n`` tokens, that occurs
  earlier in the context (its earliest occurrence), followed by up to ``k`` tokens.
* :class:`SuffixIndex` – the suffix tree of vLLM's ``suffix`` method
  (arctic-inference's ``SuffixTree``, path mode): occurrence counts of every
  substring of at most ``max_depth`` tokens of its sequences; a draft continues
  the best-scoring match of a suffix of the pattern with the most frequent next
  token while its estimated probability stays at or above ``min_token_prob``.
  :class:`SuffixDrafter` combines a request's own tree (its prompt and response)
  with an engine's global tree (the responses it served), as arctic-inference's
  ``SuffixDecodingCache`` does.

Counts come from occurrence search over the sequences (numpy), not from a
compressed tree: the counts a compressed suffix tree keeps in its nodes are the
occurrence counts of the substrings they spell, so the proposals are the same;
the one freedom is a tie between equally frequent next tokens, which the tree
breaks by its hash map's order and this module by the earliest occurrence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from heddle.exceptions import ConfigError

__all__ = [
    "SUFFIX_DEFAULTS",
    "Draft",
    "SuffixDrafter",
    "SuffixIndex",
    "SuffixParams",
    "accepted_prefix",
    "ngram_draft",
]


@dataclass(frozen=True)
class SuffixParams:
    """vLLM's ``suffix_decoding_*`` settings (0.32 defaults)."""

    max_tree_depth: int = 24
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        if self.max_tree_depth < 1:
            raise ConfigError(f"max_tree_depth={self.max_tree_depth} must be at least 1")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise ConfigError(f"min_token_prob={self.min_token_prob} must be in [0, 1]")


SUFFIX_DEFAULTS = SuffixParams()


@dataclass(frozen=True)
class Draft:
    """Proposed tokens, their summed estimated probability, and the match length."""

    token_ids: tuple[int, ...] = ()
    score: float = 0.0
    match_len: int = 0


def accepted_prefix(draft: Sequence[int], actual: Sequence[int]) -> int:
    """Draft tokens accepted when the target samples ``actual``: the common prefix."""
    n = 0
    for d, a in zip(draft, actual, strict=False):
        if d != a:
            break
        n += 1
    return n


def ngram_draft(context: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """vLLM's n-gram proposal for ``context`` (``_find_longest_matched_ngram_and_propose_tokens``).

    The longest ``n`` in ``[min_n, max_n]`` whose last-``n``-token suffix occurs
    earlier in the context (overlaps allowed, not the suffix itself), its earliest
    occurrence, and up to ``k`` tokens after it (fewer near the end).
    """
    if min_n < 1 or max_n < min_n:
        raise ConfigError(f"ngram sizes min={min_n}, max={max_n}: need 1 <= min <= max")
    tokens = np.asarray(context, dtype=np.int64)
    total = len(tokens)
    if total < min_n or k <= 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n :]
        # Candidate starts s in [0, total - n - 1]: windows that end before the suffix does.
        starts = np.flatnonzero(tokens[: total - n] == suffix[0])
        for j in range(1, n):
            if not len(starts):
                break
            starts = starts[tokens[starts + j] == suffix[j]]
        if len(starts):
            begin = int(starts[0]) + n
            return [int(t) for t in tokens[begin : min(begin + k, total)]]
    return []


class SuffixIndex:
    """Sequences of token ids, searched like arctic-inference's ``SuffixTree`` (path mode).

    ``count(s)`` is the number of occurrences of ``s`` (``len(s) <= max_depth``)
    inside one sequence; the tree's node counts are exactly these.
    """

    def __init__(self, max_depth: int = SUFFIX_DEFAULTS.max_tree_depth) -> None:
        if max_depth < 1:
            raise ConfigError(f"max_depth={max_depth} must be at least 1")
        self.max_depth = max_depth
        self._seqs: dict[object, list[int]] = {}
        self._flat: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._seqs)

    def extend(self, seq_id: object, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to sequence ``seq_id`` (created if new)."""
        self._seqs.setdefault(seq_id, []).extend(int(t) for t in tokens)
        self._flat = None

    def remove(self, seq_id: object) -> None:
        if self._seqs.pop(seq_id, None) is not None:
            self._flat = None

    def _array(self) -> np.ndarray:
        """All sequences concatenated, each followed by a separator no token equals."""
        if self._flat is None:
            parts: list[int] = []
            for i, seq in enumerate(self._seqs.values()):
                parts.extend(seq)
                parts.append(-1 - i)
            self._flat = np.asarray(parts, dtype=np.int64)
        return self._flat

    def speculate(
        self, pattern: Sequence[int], max_spec_tokens: int, params: SuffixParams = SUFFIX_DEFAULTS
    ) -> Draft:
        """The tree's ``speculate``: best score over every suffix of the pattern."""
        arr = self._array()
        pat = [int(t) for t in pattern][-self.max_depth :]
        if not len(arr) or not pat or max_spec_tokens <= 0:
            return Draft()
        # ends[m]: positions where the pattern's last m tokens end (m = 1..len(pat)).
        ends_by_len: list[np.ndarray] = []
        ends = np.flatnonzero(arr == pat[-1])
        for m in range(1, len(pat) + 1):
            if m > 1:
                back = ends - (m - 1)
                ok = back >= 0
                ends = ends[ok]
                ends = ends[arr[back[ok]] == pat[-m]]
            if not len(ends):
                break
            ends_by_len.append(ends)
        best = Draft()
        # The tree tries the longest match first and keeps a later one only if it scores more.
        for m in range(len(ends_by_len), 0, -1):
            limit = min(
                max_spec_tokens, int(m * params.max_spec_factor + params.max_spec_offset + 1e-6)
            )
            draft = self._walk(arr, ends_by_len[m - 1], m, max(limit, 0), params.min_token_prob)
            if draft.score > best.score:
                best = Draft(draft.token_ids, draft.score, m)
        return best

    def _walk(
        self, arr: np.ndarray, ends: np.ndarray, depth: int, limit: int, min_prob: float
    ) -> Draft:
        """Follow the most frequent continuation from the occurrences ``ends``."""
        tokens: list[int] = []
        prob, score = 1.0, 0.0
        n = len(arr)
        while len(tokens) < limit and depth < self.max_depth:
            nxt = ends + 1
            nxt = nxt[nxt < n]
            follow = arr[nxt]
            keep = follow >= 0
            nxt, follow = nxt[keep], follow[keep]
            if not len(follow):
                break
            values, first, counts = np.unique(follow, return_index=True, return_counts=True)
            top = counts.max()
            # Ties: the earliest occurrence (a stable, documented choice; see the module doc).
            choice = int(np.argmin(np.where(counts == top, first, n + 1)))
            token = int(values[choice])
            new_prob = prob * float(top) / float(len(ends))
            if new_prob < min_prob:
                break
            prob = new_prob
            tokens.append(token)
            score += prob
            ends = nxt[follow == token]
            depth += 1
        return Draft(tuple(tokens), score, 0)


class SuffixDrafter:
    """vLLM's suffix proposer for one request: its own tree, then the engine's global one.

    ``own`` holds the request's prompt and response (arctic's per-request tree);
    ``shared`` is the global tree of responses (the engine's served requests, or any
    corpus Heddle seeds). The draft with the higher score wins; ties keep ``own``.
    """

    def __init__(
        self,
        prompt: Sequence[int],
        shared: SuffixIndex | None,
        params: SuffixParams = SUFFIX_DEFAULTS,
    ) -> None:
        self.params = params
        self.own = SuffixIndex(params.max_tree_depth)
        self.own.extend(0, prompt)
        self.shared = shared
        self.context: list[int] = [int(t) for t in prompt]

    def append(self, tokens: Sequence[int]) -> None:
        """Tokens the request generated (own tree and context; the caller feeds ``shared``)."""
        self.own.extend(0, tokens)
        self.context.extend(int(t) for t in tokens)

    def propose(self, k: int) -> Draft:
        pattern = self.context[-self.params.max_tree_depth :]
        draft = self.own.speculate(pattern, k, self.params)
        if self.shared is not None and len(self.shared):
            other = self.shared.speculate(pattern, k, self.params)
            if other.score > draft.score:
                draft = other
        return draft
