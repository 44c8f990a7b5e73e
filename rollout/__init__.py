"""heddle.rollout: one rollout of a RolloutJob, wherever it runs.

The session (every task sample's agent loop under one scheduling policy), its
environments (``tools``, ``synthetic``, ``external`` through the gateway), tools and
rewards, task sets, the output record and its trainer exports, progress, and the one
planning path from (job, pool, tasks) to a running session: ``prepare_job`` and
``run_local`` for ``heddle run``; the operator and the benchmarks use the same pieces
(docs/rollouts.md).
"""

from ._admission import (
    AdmissionWindow,
)
from ._answers import expected_answer, extract_answer, same_answer
from ._environments import (
    Environment,
    Episode,
    Outcome,
    ParsedCalls,
    SyntheticEnvironment,
    synthetic_tasks,
)
from ._export import (
    TRAINERS,
    check_record,
    collate_skyrl,
    collate_verl,
    export_rows,
    read_records,
    write_export,
)
from ._external import (
    ExternalEnvironment,
    ExternalEpisode,
)
from ._formats import (
    TRAINER_KEYS,
    parquet_rows,
    split_trainer_row,
)
from ._gateway import (
    TRAJECTORY_HEADER,
    Gateway,
    create_gateway_app,
)
from ._gateway_messages import (
    ChatCall,
    ChatReply,
    GatewayError,
    all_same,
    first_difference,
    normal_message,
    openai_call,
    stored_reply,
)
from ._hosts import (
    ALLOWED_HOSTS_ENV,
    ANY_HOST,
    LOCAL_DEFAULT,
    HostAllowList,
    HostRefusedError,
    check_tool_hosts,
    guarded_client,
)
from ._local import (
    TINY,
    TINY_DIR,
    LocalPool,
    LocalWorkerOptions,
    die_with_parent,
    is_tiny_model,
    local_model_dir,
    worker_options,
)
from ._output import (
    OutputSink,
    encode_record,
    lock_path,
    record_key,
)
from ._output_record import (
    OutputRecord,
    RecordPlacement,
    RecordSpeculation,
    RecordTimings,
    RecordTokens,
    RecordTrace,
    TrajectoryStatus,
)
from ._paths import (
    DATA_ROOT,
    confine,
)
from ._presets import (
    WORKLOAD_PRESETS,
    load_bench_workload,
    load_cluster,
    load_workload,
)
from ._progress import (
    Progress,
    SessionMetrics,
    TokenRate,
)
from ._record import (
    TrajectoryRun,
)
from ._reward_stats import read_output_records, reward_stats
from ._rewards import (
    AnswerReward,
    CodeReward,
    HttpReward,
    RewardResult,
    RewardScorer,
    ScriptedReward,
    extract_code,
    make_scorer,
)
from ._run import (
    GATEWAY_TOKEN_ENV,
    GatewayOptions,
    LocalJob,
    PoolPlan,
    ProgressPrinter,
    build_session,
    gateway_file,
    job_workload,
    perf_model_for,
    prepare_job,
    prepare_manifests,
    read_job_tasks,
    resolve_job,
    run_local,
    session_config_for,
    trace_path,
)
from ._sandbox import SandboxLimits, SandboxResult, run_python
from ._session import (
    RolloutSession,
    SessionConfig,
    SessionResult,
    step_seed,
)
from ._tail import (
    RecordTail,
)
from ._tasks import (
    Task,
    TaskSet,
    parse_task,
    read_tasks,
)
from ._tools import (
    MAX_REPLY_BYTES,
    HermesParser,
    ToolCall,
    ToolCallParser,
    ToolsEnvironment,
    read_capped,
    transport_cause,
)
from ._weights import (
    WeightsKeeper,
)

__all__ = [
    "ALLOWED_HOSTS_ENV",
    "ANY_HOST",
    "DATA_ROOT",
    "GATEWAY_TOKEN_ENV",
    "LOCAL_DEFAULT",
    "MAX_REPLY_BYTES",
    "TINY",
    "TINY_DIR",
    "TRAINERS",
    "TRAINER_KEYS",
    "TRAJECTORY_HEADER",
    "WORKLOAD_PRESETS",
    "AdmissionWindow",
    "AnswerReward",
    "ChatCall",
    "ChatReply",
    "CodeReward",
    "Environment",
    "Episode",
    "ExternalEnvironment",
    "ExternalEpisode",
    "Gateway",
    "GatewayError",
    "GatewayOptions",
    "HermesParser",
    "HostAllowList",
    "HostRefusedError",
    "HttpReward",
    "LocalJob",
    "LocalPool",
    "LocalWorkerOptions",
    "Outcome",
    "OutputRecord",
    "OutputSink",
    "ParsedCalls",
    "PoolPlan",
    "Progress",
    "ProgressPrinter",
    "RecordPlacement",
    "RecordSpeculation",
    "RecordTail",
    "RecordTimings",
    "RecordTokens",
    "RecordTrace",
    "RewardResult",
    "RewardScorer",
    "RolloutSession",
    "SandboxLimits",
    "SandboxResult",
    "ScriptedReward",
    "SessionConfig",
    "SessionMetrics",
    "SessionResult",
    "SyntheticEnvironment",
    "Task",
    "TaskSet",
    "TokenRate",
    "ToolCall",
    "ToolCallParser",
    "ToolsEnvironment",
    "TrajectoryRun",
    "TrajectoryStatus",
    "WeightsKeeper",
    "all_same",
    "build_session",
    "check_record",
    "check_tool_hosts",
    "collate_skyrl",
    "collate_verl",
    "confine",
    "create_gateway_app",
    "die_with_parent",
    "encode_record",
    "expected_answer",
    "export_rows",
    "extract_answer",
    "extract_code",
    "first_difference",
    "gateway_file",
    "guarded_client",
    "is_tiny_model",
    "job_workload",
    "load_bench_workload",
    "load_cluster",
    "load_workload",
    "local_model_dir",
    "lock_path",
    "make_scorer",
    "normal_message",
    "openai_call",
    "parquet_rows",
    "parse_task",
    "perf_model_for",
    "prepare_job",
    "prepare_manifests",
    "read_capped",
    "read_job_tasks",
    "read_output_records",
    "read_records",
    "read_tasks",
    "record_key",
    "resolve_job",
    "reward_stats",
    "run_local",
    "run_python",
    "same_answer",
    "session_config_for",
    "split_trainer_row",
    "step_seed",
    "stored_reply",
    "synthetic_tasks",
    "trace_path",
    "transport_cause",
    "worker_options",
    "write_export",
]
