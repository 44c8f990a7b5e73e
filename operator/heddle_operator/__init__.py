"""heddle.operator: the kopf operator that reconciles EnginePools and RolloutJobs.

Thin kopf handlers (``build_registry``, ``run_operator``) over pure builders and
reconcile planners, the pool's worker token, and the Kubernetes API client on the
official ``kubernetes`` package (docs/operator.md). The rollout itself is
:mod:`heddle.rollout`; this package only decides what should run where.
"""

from ._builders import (
    MAX_CONDITION_MESSAGE,
    WORKER_PORT,
    condition,
    headless_service,
    instance_name,
    merge_conditions,
    pod_phase,
    shape_entries,
    spec_hash,
    worker_pod,
)
from ._jobs import (
    JobContext,
    run_job,
)
from ._kube import (
    ApiError,
    KubeClient,
    Resource,
    RetryPolicy,
    load_configuration,
)
from ._operator import (
    OperatorConfig,
    build_registry,
    run_operator,
)
from ._pools import (
    OwnWrites,
    PoolRuntime,
    baseline_shape,
    reconcile_pool,
)
from ._reconcile import (
    PodView,
    PoolActions,
    plan_pool,
)
from ._tokens import (
    TOKEN_KEY,
    TokenState,
    ensure_worker_token,
    read_worker_token,
    token_digest,
    token_env,
    token_secret,
    token_secret_name,
)

__all__ = [
    "MAX_CONDITION_MESSAGE",
    "TOKEN_KEY",
    "WORKER_PORT",
    "ApiError",
    "JobContext",
    "KubeClient",
    "OperatorConfig",
    "OwnWrites",
    "PodView",
    "PoolActions",
    "PoolRuntime",
    "Resource",
    "RetryPolicy",
    "TokenState",
    "baseline_shape",
    "build_registry",
    "condition",
    "ensure_worker_token",
    "headless_service",
    "instance_name",
    "load_configuration",
    "merge_conditions",
    "plan_pool",
    "pod_phase",
    "read_worker_token",
    "reconcile_pool",
    "run_job",
    "run_operator",
    "shape_entries",
    "spec_hash",
    "token_digest",
    "token_env",
    "token_secret",
    "token_secret_name",
    "worker_pod",
]
