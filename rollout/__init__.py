"""heddle.rollout: one rollout of a RolloutJob, wherever it runs.

The session (every task sample's agent loop under one scheduling policy), its
environments (``tools``, ``synthetic``, ``external`` through the gateway), tools and
rewards, task sets, the output record and its trainer exports, progress, and the one
planning path from (job, pool, tasks) to a running session: ``prepare_job`` and
``run_local`` for ``heddle run``; the operator and the benchmarks use the same pieces
(docs/rollouts.md).
"""

from ._answers import expected_answer, extract_answer, same_answer
from ._colocation import ColocationVerdict, live_colocation
from ._contract import FAILED_ROWS, is_placeholder, order_rows, placeholder_record
from ._decide import NextDecisions, announce_next, decide_ahead, decide_run, plan_pool
from ._decided import (
    AHEAD_WAIT_LIMIT_S,
    DECISIONS_DIR,
    DecidedRun,
    DecisionCache,
    decision_inputs,
    decision_key,
    read_decided,
)
from ._decisions import CPUS_ENV, ProcessRunner, usable_cpus
from ._drafts_feed import (
    DraftCorpus,
    DraftsFeed,
    DraftsFeedConfig,
    DraftText,
    pool_corpus,
)
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
    action_ranges,
    check_record,
    collate_skyrl,
    collate_verl,
    convert_records,
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
    GatewayError,
)
from ._groups import Batch, FinishedGroup, GroupStream, LengthReport, length_report
from ._hosts import (
    ALLOWED_HOSTS_ENV,
    ANY_HOST,
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
    local_model_dir,
    local_speculation,
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
from ._previous import (
    HISTORY_DIR,
    STATE_DIR_ENV,
    PreviousRollouts,
    finished_records,
    read_history,
    state_dir,
)
from ._progress import (
    Progress,
    SessionMetrics,
)
from ._record import (
    TrajectoryRun,
)
from ._replies import MAX_REPLY_BYTES
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
    build_environment,
    build_session,
    drafts_feed_for,
    gateway_file,
    job_workload,
    perf_model_for,
    prepare_job,
    prepare_manifests,
    read_job_tasks,
    resolve_job,
    run_local,
    serve_trainer,
    session_config_for,
    trace_path,
    trainer_file,
)
from ._sandbox import SandboxLimits, SandboxResult, run_python
from ._seed_gate import SeedDecision, SeedGate, engine_k
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
from ._tools import HermesParser, ToolCallParser, ToolInvocation, ToolsEnvironment
from ._trainer_api import TRAINER_TOKEN_ENV, TrainerServer, create_trainer_app

__all__ = [
    "AHEAD_WAIT_LIMIT_S",
    "ALLOWED_HOSTS_ENV",
    "ANY_HOST",
    "CPUS_ENV",
    "DATA_ROOT",
    "DECISIONS_DIR",
    "FAILED_ROWS",
    "GATEWAY_TOKEN_ENV",
    "HISTORY_DIR",
    "MAX_REPLY_BYTES",
    "STATE_DIR_ENV",
    "TINY",
    "TINY_DIR",
    "TRAINERS",
    "TRAINER_KEYS",
    "TRAINER_TOKEN_ENV",
    "TRAJECTORY_HEADER",
    "WORKLOAD_PRESETS",
    "AnswerReward",
    "Batch",
    "CodeReward",
    "ColocationVerdict",
    "DecidedRun",
    "DecisionCache",
    "DraftCorpus",
    "DraftText",
    "DraftsFeed",
    "DraftsFeedConfig",
    "Environment",
    "Episode",
    "ExternalEnvironment",
    "ExternalEpisode",
    "FinishedGroup",
    "Gateway",
    "GatewayError",
    "GatewayOptions",
    "GroupStream",
    "HermesParser",
    "HostAllowList",
    "HostRefusedError",
    "HttpReward",
    "LengthReport",
    "LocalJob",
    "LocalPool",
    "LocalWorkerOptions",
    "NextDecisions",
    "Outcome",
    "OutputRecord",
    "OutputSink",
    "ParsedCalls",
    "PoolPlan",
    "PreviousRollouts",
    "ProcessRunner",
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
    "SeedDecision",
    "SeedGate",
    "SessionConfig",
    "SessionMetrics",
    "SessionResult",
    "SyntheticEnvironment",
    "Task",
    "TaskSet",
    "ToolCallParser",
    "ToolInvocation",
    "ToolsEnvironment",
    "TrainerServer",
    "TrajectoryRun",
    "TrajectoryStatus",
    "action_ranges",
    "announce_next",
    "build_environment",
    "build_session",
    "check_record",
    "check_tool_hosts",
    "collate_skyrl",
    "collate_verl",
    "confine",
    "convert_records",
    "create_gateway_app",
    "create_trainer_app",
    "decide_ahead",
    "decide_run",
    "decision_inputs",
    "decision_key",
    "die_with_parent",
    "drafts_feed_for",
    "encode_record",
    "engine_k",
    "expected_answer",
    "export_rows",
    "extract_answer",
    "extract_code",
    "finished_records",
    "gateway_file",
    "guarded_client",
    "is_placeholder",
    "job_workload",
    "length_report",
    "live_colocation",
    "load_bench_workload",
    "load_cluster",
    "load_workload",
    "local_model_dir",
    "local_speculation",
    "lock_path",
    "make_scorer",
    "order_rows",
    "parquet_rows",
    "parse_task",
    "perf_model_for",
    "placeholder_record",
    "plan_pool",
    "pool_corpus",
    "prepare_job",
    "prepare_manifests",
    "read_decided",
    "read_history",
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
    "serve_trainer",
    "session_config_for",
    "split_trainer_row",
    "state_dir",
    "step_seed",
    "synthetic_tasks",
    "trace_path",
    "trainer_file",
    "usable_cpus",
    "worker_options",
    "write_export",
]
