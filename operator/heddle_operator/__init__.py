"""heddle.operator: the kopf operator that reconciles EnginePools and RolloutJobs.

Thin kopf handlers (``build_registry``, ``run_operator``) over pure builders and
reconcile planners, the pool's worker token, and the Kubernetes API client on the
official ``kubernetes`` package (docs/operator.md), and the session pod's runner
(``heddle session``: one RolloutJob's session, in a pod of its own, talking to the
API). The rollout itself is :mod:`heddle.rollout`; the operator only decides what
should run where.
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
    worker_network_policy,
    worker_pod,
)
from ._job_status import (
    FINISHED,
    JobStatus,
    progress_fields,
)
from ._jobs import (
    JobContext,
    delete_session_pods,
    run_job,
    session_pods,
)
from ._kube import (
    ROLLOUTJOBS,
    SECRETS,
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
    DECISIONS_KEPT,
    OwnWrites,
    PoolRuntime,
    baseline_shape,
    kept_decisions,
    reconcile_pool,
)
from ._reconcile import (
    PodView,
    PoolActions,
    pool_actions,
)
from ._session_builders import (
    GATEWAY_PORT,
    SESSION_ACCOUNT,
    SESSION_CONFIG_ENV,
    TRAINER_PORT,
    SessionPodOptions,
    gateway_objects,
    gateway_secret_name,
    gateway_url,
    serves_trainer,
    session_account,
    session_pod,
    session_rbac,
    trainer_objects,
    trainer_secret_name,
    trainer_url,
)
from ._session_pod import (
    SESSION_RETRY,
    SessionPodConfig,
    ready_workers,
    run_session_pod,
)
from ._session_status import SessionPublished
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
    "DECISIONS_KEPT",
    "FINISHED",
    "GATEWAY_PORT",
    "MAX_CONDITION_MESSAGE",
    "ROLLOUTJOBS",
    "SECRETS",
    "SESSION_ACCOUNT",
    "SESSION_CONFIG_ENV",
    "SESSION_RETRY",
    "TOKEN_KEY",
    "TRAINER_PORT",
    "WORKER_PORT",
    "ApiError",
    "JobContext",
    "JobStatus",
    "KubeClient",
    "OperatorConfig",
    "OwnWrites",
    "PodView",
    "PoolActions",
    "PoolRuntime",
    "Resource",
    "RetryPolicy",
    "SessionPodConfig",
    "SessionPodOptions",
    "SessionPublished",
    "TokenState",
    "baseline_shape",
    "build_registry",
    "condition",
    "delete_session_pods",
    "ensure_worker_token",
    "gateway_objects",
    "gateway_secret_name",
    "gateway_url",
    "headless_service",
    "instance_name",
    "kept_decisions",
    "load_configuration",
    "merge_conditions",
    "pod_phase",
    "pool_actions",
    "progress_fields",
    "read_worker_token",
    "ready_workers",
    "reconcile_pool",
    "run_job",
    "run_operator",
    "run_session_pod",
    "serves_trainer",
    "session_account",
    "session_pod",
    "session_pods",
    "session_rbac",
    "shape_entries",
    "spec_hash",
    "token_digest",
    "token_env",
    "token_secret",
    "token_secret_name",
    "trainer_objects",
    "trainer_secret_name",
    "trainer_url",
    "worker_network_policy",
    "worker_pod",
]
