"""heddle.worker: the pod-side process, an engine behind a trajectory-resident HTTP API.

``heddle worker --engine sim|vllm`` starts one (docs/worker-api.md). The API
keeps each trajectory's token context on the worker, so a step sends only new
tokens and hits the engine's prefix cache; contexts move between workers with
GET (export) and PUT (import, optionally warming the cache).

The ``sim`` engine runs the simulator's performance model in scaled real time
with synthetic tokens, for scale tests and benchmarks without a model; the
``vllm`` engine runs vLLM in process (the ``vllm`` extra).
"""

from ._app import WorkerState, create_app
from ._auth import OPEN_PATHS, TOKEN_ENV, read_token
from ._auto_speculation import (
    AUTO_ACCEPTANCE,
    AUTO_CONTEXT_TOKENS,
    auto_speculation,
    auto_table,
)
from ._body_limit import MAX_BODY_BYTES
from ._chat import TOOL_PARSERS, tool_schema_error
from ._client import StepReply, WorkerClient, WorkerEndpoint
from ._command import DEFAULT_WORKER_ARGS, WorkerArgs, add_worker_arguments, parse_worker_argv
from ._engine import Engine, EngineError, EngineStats, ParsedTurn, Sampling, StepOutput
from ._environment import (
    Check,
    check_vllm_environment,
    is_cpu_build,
    probe_vllm_import,
    vllm_environment_checks,
)
from ._http import KEEP_ALIVE_S, HttpError, HttpPool, HttpTimeoutError
from ._models import NAMED_MODELS, TINY, TINY_DIR, named_model_dir
from ._resident import (
    DEFAULT_MAX_RESIDENT,
    DEFAULT_RESIDENT_TTL_S,
    ResidentContexts,
    job_of,
    trajectory_id,
)
from ._schemas import (
    FIELD_RANGES,
    ChatMessage,
    ErrorResponse,
    ExportResponse,
    FunctionCall,
    GenerateRequest,
    GenerateResponse,
    ImportRequest,
    ImportResponse,
    SamplingParams,
    StateResponse,
    Timings,
    ToolCall,
    WeightsRequest,
    WeightsResponse,
)
from ._server import listen_socket, serve
from ._sim_engine import SimulatedEngine
from ._smollm2 import SMOLLM2, ModelManifest, default_model_cache, ensure_smollm2
from ._smollm2_tools import SMOLLM2_TOOL_PARSER, SMOLLM2_TOOLS_TEMPLATE, install_tool_template
from ._speculation import (
    DEFAULT_SPECULATIVE_TOKENS,
    NO_SPECULATION,
    SPECULATION_METHODS,
    SPECULATION_REFUSED_SAMPLING,
    Speculation,
    check_batch_size_table,
    parse_batch_size_table,
    suffix_available,
)
from ._tiny_model import write_tiny_model
from ._vllm_engine import VLLMConfig, VLLMEngine, parse_engine_arg
from ._vllm_env import THREADS_BIND, vllm_cpu_env
from ._weights import LoadedWeights, weights_path
from ._weights_push import PushPlan, PushRequest, PushResult
from ._weights_sender import changed_tensors, push_weights

__all__ = [
    "AUTO_ACCEPTANCE",
    "AUTO_CONTEXT_TOKENS",
    "DEFAULT_MAX_RESIDENT",
    "DEFAULT_RESIDENT_TTL_S",
    "DEFAULT_SPECULATIVE_TOKENS",
    "DEFAULT_WORKER_ARGS",
    "FIELD_RANGES",
    "KEEP_ALIVE_S",
    "MAX_BODY_BYTES",
    "NAMED_MODELS",
    "NO_SPECULATION",
    "OPEN_PATHS",
    "SMOLLM2",
    "SMOLLM2_TOOLS_TEMPLATE",
    "SMOLLM2_TOOL_PARSER",
    "SPECULATION_METHODS",
    "SPECULATION_REFUSED_SAMPLING",
    "THREADS_BIND",
    "TINY",
    "TINY_DIR",
    "TOKEN_ENV",
    "TOOL_PARSERS",
    "ChatMessage",
    "Check",
    "Engine",
    "EngineError",
    "EngineStats",
    "ErrorResponse",
    "ExportResponse",
    "FunctionCall",
    "GenerateRequest",
    "GenerateResponse",
    "HttpError",
    "HttpPool",
    "HttpTimeoutError",
    "ImportRequest",
    "ImportResponse",
    "LoadedWeights",
    "ModelManifest",
    "ParsedTurn",
    "PushPlan",
    "PushRequest",
    "PushResult",
    "ResidentContexts",
    "Sampling",
    "SamplingParams",
    "SimulatedEngine",
    "Speculation",
    "StateResponse",
    "StepOutput",
    "StepReply",
    "Timings",
    "ToolCall",
    "VLLMConfig",
    "VLLMEngine",
    "WeightsRequest",
    "WeightsResponse",
    "WorkerArgs",
    "WorkerClient",
    "WorkerEndpoint",
    "WorkerState",
    "add_worker_arguments",
    "auto_speculation",
    "auto_table",
    "changed_tensors",
    "check_batch_size_table",
    "check_vllm_environment",
    "create_app",
    "default_model_cache",
    "ensure_smollm2",
    "install_tool_template",
    "is_cpu_build",
    "job_of",
    "listen_socket",
    "named_model_dir",
    "parse_batch_size_table",
    "parse_engine_arg",
    "parse_worker_argv",
    "probe_vllm_import",
    "push_weights",
    "read_token",
    "serve",
    "suffix_available",
    "tool_schema_error",
    "trajectory_id",
    "vllm_cpu_env",
    "vllm_environment_checks",
    "weights_path",
    "write_tiny_model",
]
