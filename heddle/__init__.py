"""Heddle: trajectory-level scheduling of agentic-RL rollouts on Kubernetes.

The distribution holds four parts (see docs/architecture.md):

* :mod:`heddle.scheduler` – the pure scheduling core (stdlib + numpy only),
* :mod:`heddle.worker` – the pod-side engine process,
* :mod:`heddle.operator` – the kopf operator, the rollout session and the CLI,
* :mod:`heddle.exceptions` – the one exceptions module every part shares.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("heddle")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
