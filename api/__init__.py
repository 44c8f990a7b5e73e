"""heddle.api: the resources Heddle serves, as Kubernetes and ``heddle run`` read them.

The API group and version, the EnginePool and RolloutJob specs as frozen, validated
dataclasses (``load_manifests``), the reward and pod-template blocks, and YAML read
without echoing content. Used by the rollout, the operator and the CLI alike, so a
manifest means the same thing on a cluster and on a laptop (docs/resources.md).
"""

from ._fields import (
    Fields,
)
from ._manifests import (
    MAX_SAMPLES_PER_TASK,
    MAX_TRAJECTORIES,
    EnginePoolSpec,
    EnvironmentSpec,
    ExternalSpec,
    RolloutJobSpec,
    SamplingSpec,
    SessionPodSpec,
    SyntheticSpec,
    ToolEndpointSpec,
    ToolsSpec,
    WeightsSpec,
    check_trajectories,
    load_manifests,
)
from ._names import (
    ANNOTATION_DRAINING,
    ANNOTATION_DRAINING_SINCE,
    ANNOTATION_SPEC_HASH,
    API_VERSION,
    ENGINEPOOL_KIND,
    ENGINEPOOL_PLURAL,
    FINALIZER,
    GROUP,
    LABEL_JOB,
    LABEL_POOL,
    LABEL_TP,
    ROLLOUTJOB_KIND,
    ROLLOUTJOB_PLURAL,
    VERSION,
    InstancePhase,
    JobPhase,
)
from ._pod_template import (
    WORKER_CONTAINER,
    apply_pod_template,
    check_pod_template,
    check_quantity,
    guaranteed_resources,
)
from ._reward_spec import (
    ON_REWARD_ERROR,
    REWARD_TYPES,
    RewardSpec,
    parse_reward,
)
from ._yaml import (
    read_text,
    safe_load_all,
)

__all__ = [
    "ANNOTATION_DRAINING",
    "ANNOTATION_DRAINING_SINCE",
    "ANNOTATION_SPEC_HASH",
    "API_VERSION",
    "ENGINEPOOL_KIND",
    "ENGINEPOOL_PLURAL",
    "FINALIZER",
    "GROUP",
    "LABEL_JOB",
    "LABEL_POOL",
    "LABEL_TP",
    "MAX_SAMPLES_PER_TASK",
    "MAX_TRAJECTORIES",
    "ON_REWARD_ERROR",
    "REWARD_TYPES",
    "ROLLOUTJOB_KIND",
    "ROLLOUTJOB_PLURAL",
    "VERSION",
    "WORKER_CONTAINER",
    "EnginePoolSpec",
    "EnvironmentSpec",
    "ExternalSpec",
    "Fields",
    "InstancePhase",
    "JobPhase",
    "RewardSpec",
    "RolloutJobSpec",
    "SamplingSpec",
    "SessionPodSpec",
    "SyntheticSpec",
    "ToolEndpointSpec",
    "ToolsSpec",
    "WeightsSpec",
    "apply_pod_template",
    "check_pod_template",
    "check_quantity",
    "check_trajectories",
    "guaranteed_resources",
    "load_manifests",
    "parse_reward",
    "read_text",
    "safe_load_all",
]
