"""``spec.environment.reward``: how a finished trajectory gets its score.

Kept apart from the scorers (``_rewards.py``) so the manifest parser does not
import HTTP code. docs/resources.md documents each field.
"""

from __future__ import annotations

from dataclasses import dataclass

from heddle.exceptions import ManifestError

from ._fields import Fields

__all__ = ["MAX_RETRIES", "ON_REWARD_ERROR", "REWARD_TYPES", "RewardSpec", "parse_reward"]

REWARD_TYPES = ("http", "scripted", "answer", "code")
ON_REWARD_ERROR = ("record", "fail")
# A tool's or reward's extra attempts at most (also the CRD schema's maximum): each one
# waits up to its timeout, so an unbounded count holds a trajectory (and its slot) forever.
MAX_RETRIES = 10


@dataclass(frozen=True)
class RewardSpec:
    """``http``: POST the record to ``url``; ``scripted``: a seeded coin per (task, sample);
    ``answer``: the final answer against the task's; ``code``: the task's tests in a sandbox."""

    type: str
    url: str = ""
    timeout_s: float = 30.0  # one attempt, connect to last byte (as for tools)
    retries: int = 2  # extra attempts after the first
    on_error: str = "record"  # 'record': reward null + reward_error; 'fail': fail the trajectory
    success_rate: float = 0.5  # scripted: share of samples scored 1.0 (the rest 0.0)
    seed: int = 0  # scripted: another seed, other scores
    memory_mib: int = 512  # code: the sandbox's address-space limit


def parse_reward(r: Fields) -> RewardSpec:
    kind = r.choice("type", REWARD_TYPES, "http")
    on_error = r.choice("onError", ON_REWARD_ERROR, "record")
    if kind == "answer":
        spec = RewardSpec("answer", on_error=on_error)
    elif kind == "code":
        spec = RewardSpec(
            "code",
            timeout_s=r.number("timeoutSeconds", 10.0, exclusive_minimum=True),
            on_error=on_error,
            memory_mib=r.integer("memoryMiB", 512, minimum=64),
        )
    elif kind == "scripted":
        spec = RewardSpec(
            "scripted",
            on_error=on_error,
            success_rate=r.number("successRate", 0.5, minimum=0.0, maximum=1.0),
            seed=r.integer("seed", 0),
        )
    else:
        url = r.string("url", required=True)
        if not url.startswith(("http://", "https://")):
            raise ManifestError(f"{r.where('url')}={url!r} must start with http:// or https://")
        spec = RewardSpec(
            "http",
            url=url,
            timeout_s=r.number("timeoutSeconds", 30.0, exclusive_minimum=True),
            retries=r.integer("retries", 2, maximum=MAX_RETRIES),
            on_error=on_error,
        )
    r.done()
    return spec
