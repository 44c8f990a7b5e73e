"""Replaying recorded outputs against vLLM's drafters: exact tokens per decode step.

A recorded sample is what the target model sampled, so a draft token is
accepted iff it equals the recorded token at its position (one-hot drafts under
rejection sampling). :func:`replay_group` runs the samples of one GRPO group as
one engine would serve them side by side, in vLLM's order within a step: each
request first adds the tokens its last verification produced to the trees, then
proposes. Text from siblings is therefore used only once it existed; earlier
samples of the task ("history") are in the engine's tree from the start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from heddle.exceptions import ConfigError

from ._drafting import (
    SUFFIX_DEFAULTS,
    SuffixDrafter,
    SuffixIndex,
    SuffixParams,
    accepted_prefix,
    ngram_draft,
)

__all__ = [
    "SOURCES",
    "ReplayConfig",
    "ReplaySample",
    "SampleReplay",
    "replay_group",
    "tokens_per_step",
]

Method = Literal["ngram", "suffix"]
Source = Literal["own", "siblings", "history"]
SOURCES: tuple[Source, ...] = ("own", "siblings", "history")


@dataclass(frozen=True)
class ReplaySample:
    """One recorded sample: its GRPO group, index, prompt ids and output ids."""

    group: str
    sample: int
    prompt: tuple[int, ...]
    output: tuple[int, ...]


@dataclass(frozen=True)
class ReplayConfig:
    """What the engine drafts from.

    ``source``: ``own`` (the request alone on its engine), ``siblings`` (the
    group's other samples on the same engine, ``siblings`` of them, all when
    None), ``history`` (the request alone with up to ``history`` finished earlier
    samples of the task in the engine's tree). ``ngram`` drafts from the request's
    own context whatever the source (vLLM's n-gram matcher sees nothing else).
    """

    method: Method = "suffix"
    k: int = 4
    source: Source = "own"
    siblings: int | None = None
    history: int = 16
    ngram_min: int = 5  # vLLM's prompt_lookup_min/max when neither is set
    ngram_max: int = 5
    suffix: SuffixParams = SUFFIX_DEFAULTS

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "suffix"):
            raise ConfigError(f"method={self.method!r}: use ngram or suffix")
        if self.source not in SOURCES:
            raise ConfigError(f"source={self.source!r}: use one of {', '.join(SOURCES)}")
        if self.k < 1:
            raise ConfigError(f"k={self.k} must be at least 1")


@dataclass
class SampleReplay:
    """One sample's replay: output length, decode steps, and tokens emitted per step."""

    group: str
    sample: int
    output_tokens: int
    emitted: list[int] = field(default_factory=list)  # per decode step, in order

    @property
    def decode_steps(self) -> int:
        return len(self.emitted)


def tokens_per_step(replays: Sequence[SampleReplay]) -> float:
    """Output tokens per decode step over ``replays`` (the first token is the prefill's)."""
    tokens = sum(max(r.output_tokens - 1, 0) for r in replays)
    steps = sum(r.decode_steps for r in replays)
    return tokens / steps if steps else 1.0


def replay_group(
    samples: Sequence[ReplaySample],
    config: ReplayConfig,
    history: Sequence[ReplaySample] = (),
) -> list[SampleReplay]:
    """Replay each of ``samples`` with the drafting corpus ``config`` names.

    With ``source="own"`` each sample runs alone; with ``siblings`` each sample runs
    with ``config.siblings`` of the others (the next ones in sample order, wrapping)
    started at the same time on the same engine, and is scored as the focus of
    that run; with ``history`` it runs alone with ``history`` in the tree (all the
    group's other samples, finished, when ``history`` is empty). Every sample of
    the group is scored once.
    """
    ordered = sorted(samples, key=lambda s: s.sample)
    out: list[SampleReplay] = []
    n = len(ordered)
    whole = config.siblings is None or config.siblings >= n - 1
    if config.source == "siblings" and config.method == "suffix" and whole:
        return _run_engine(ordered, [], config)  # one run scores every sample
    for i, focus in enumerate(ordered):
        hist: list[ReplaySample] = []
        if config.source == "siblings" and config.method == "suffix":
            others = n - 1 if config.siblings is None else min(config.siblings, n - 1)
            batch = [ordered[(i + j) % n] for j in range(others + 1)]
        else:
            batch = [focus]
        if config.source == "history" and config.method == "suffix":
            pool = list(history) or [s for s in ordered if s is not focus]
            hist = pool[: config.history]
        out.append(_run_engine(batch, hist, config)[0])
    return out


def _run_engine(
    batch: Sequence[ReplaySample], history: Sequence[ReplaySample], config: ReplayConfig
) -> list[SampleReplay]:
    """Serve ``batch`` together on one engine from its prefill on; replays in batch order."""
    shared = SuffixIndex(config.suffix.max_tree_depth)
    for j, h in enumerate(history):
        shared.extend(("history", j), h.output)
    results = [SampleReplay(s.group, s.sample, len(s.output)) for s in batch]
    drafters = [SuffixDrafter(s.prompt, shared, config.suffix) for s in batch]
    contexts = [list(s.prompt) for s in batch]
    pos = [0] * len(batch)
    # The prefill samples each request's first token; it is added at the next step.
    pending: list[tuple[int, ...]] = [s.output[:1] for s in batch]
    for j, s in enumerate(batch):
        pos[j] = min(1, len(s.output))
    while True:
        active = [j for j, s in enumerate(batch) if pending[j] or pos[j] < len(s.output)]
        if not active:
            break
        drafts: dict[int, tuple[int, ...]] = {}
        for j in active:
            new = pending[j]
            pending[j] = ()
            if new:
                contexts[j].extend(new)
                drafters[j].append(new)
                shared.extend(("batch", j), new)
            if pos[j] >= len(batch[j].output):
                continue  # it finished with the last verification
            if config.method == "ngram":
                drafts[j] = tuple(
                    ngram_draft(contexts[j], config.k, config.ngram_min, config.ngram_max)
                )
            else:
                drafts[j] = drafters[j].propose(config.k).token_ids
        for j, draft in drafts.items():
            output = batch[j].output
            accepted = accepted_prefix(draft, output[pos[j] : pos[j] + len(draft)])
            emit = min(accepted + 1, len(output) - pos[j])
            pending[j] = output[pos[j] : pos[j] + emit]
            pos[j] += emit
            results[j].emitted.append(emit)
    return results
