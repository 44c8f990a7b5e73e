"""The environment a vLLM CPU worker runs with: one definition for every way one starts.

``heddle run`` starts its workers with these defaults (cores dealt per worker);
a worker started by hand (``heddle worker --engine vllm``) fills in the same ones
for the cores ``0..tp-1``. Before, a hand-started TP=1 worker left vLLM's CPU
build to bind its threads "auto" (OpenMP over every core of a NUMA node), the
difference found between hand-started workers that crashed with SIGILL in the
AMX attention kernel and ``heddle run``'s that did not (issue 11; not reproduced
where Heddle is developed, which has no AMX). Values already in the environment
win, so an operator can still choose.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["THREADS_BIND", "vllm_cpu_env"]

THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"


def vllm_cpu_env(cores: Iterable[int], environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the CPU build's defaults filled in where it leaves them unset:
    one OpenMP core per TP rank (``cores``, in rank order), models from disk only."""
    env = dict(environ)
    env.setdefault(THREADS_BIND, "|".join(str(c) for c in cores))
    env.setdefault("HF_HUB_OFFLINE", "1")  # models come from disk or a volume
    return env
