"""EnginePool and RolloutJob manifests as frozen, validated dataclasses.

The same parser serves ``heddle run`` (local files) and the operator (objects
from the API server), so a manifest means the same thing in both. Field names
follow the CRDs (camelCase in YAML, snake_case here); docs/resources.md
documents each one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heddle.exceptions import ConfigError, ManifestError
from heddle.scheduler import (
    POLICIES,
    SAMPLING_DEFAULTS,
    SAMPLING_LIMITS,
    SIMULATION_ONLY,
    PoolShape,
    check_tp_sizes,
)
from heddle.worker import (
    SPECULATION_METHODS,
    TOOL_PARSERS,
    Speculation,
    check_batch_size_table,
    tool_schema_error,
)

from ._fields import Fields
from ._names import API_VERSION
from ._pod_template import check_pod_template, check_quantity, guaranteed_resources
from ._reward_spec import MAX_RETRIES, RewardSpec, parse_reward
from ._yaml import read_text, safe_load_all

__all__ = [
    "API_VERSION",
    "MAX_RETRIES",
    "MAX_SAMPLES_PER_TASK",
    "MAX_TRAJECTORIES",
    "PAST_BOUND",
    "REPLAN_INTERVAL_S",
    "SECRET_ARG_PATTERN",
    "AsynchronySpec",
    "EnginePoolSpec",
    "EnvironmentSpec",
    "ExternalSpec",
    "RolloutJobSpec",
    "SamplingSpec",
    "SessionPodSpec",
    "SyntheticSpec",
    "ToolEndpointSpec",
    "ToolsSpec",
    "WeightsSpec",
    "check_trajectories",
    "load_manifests",
]

MAX_SAMPLES_PER_TASK = 1024  # also the CRD schema's maximum (a test keeps them equal)
# spec.scheduling.replanIntervalSeconds when a job leaves it out; also SessionConfig's
# default (the session without a job) and the CRD schema's default (a test keeps them equal).
REPLAN_INTERVAL_S = 2.0
MAX_TRAJECTORIES = 1_000_000  # tasks x samples of one job: the session holds each in memory
# metadata.name as Kubernetes checks it (a DNS-1123 subdomain); namespaces are labels.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
ON_TOOL_ERROR = ("message", "fail")
# An engine argument that carries a credential (hf_token=...): it would sit in the pod's
# args, readable by whoever may read pods. The CRD's CEL rule on extraArgs is this pattern.
SECRET_ARG_PATTERN = "(?i)^-*([a-z0-9]+[-_])*(token|api[-_]?key|secret|password|access[-_]?key)="
_SECRET_ARG = re.compile(SECRET_ARG_PATTERN)


def _metadata(doc: Mapping[str, Any], kind: str) -> tuple[str, str]:
    meta = Fields(doc.get("metadata"), f"{kind}.metadata")
    name = meta.string("name", required=True)
    namespace = meta.string("namespace", "default")
    if len(name) > 253 or not _NAME.fullmatch(name):
        raise ManifestError(
            f"{kind}.metadata.name={name!r} is not a valid Kubernetes name; use at most 253 "
            "lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
        )
    if len(namespace) > 63 or not _LABEL.fullmatch(namespace):
        raise ManifestError(
            f"{kind}.metadata.namespace={namespace!r} is not a valid namespace; use at most 63 "
            "lower-case letters, digits and '-', starting and ending with a letter or digit"
        )
    return name, namespace


def check_trajectories(tasks: int, samples_per_task: int, where: str) -> None:
    """Refuse a job with nothing to run, or too large for one session to hold (tasks x samples)."""
    if tasks == 0:
        raise ManifestError(
            f"{where}: no task to run: the task source is empty or every row is malformed "
            "(each is reported with its line); fix the task rows"
        )
    if tasks * samples_per_task > MAX_TRAJECTORIES:
        raise ManifestError(
            f"{where}: {tasks} tasks x {samples_per_task} samples is more than "
            f"{MAX_TRAJECTORIES:,} trajectories in one job; split it into several jobs"
        )


def _engine_args(items: list[Any], where: str) -> tuple[str, ...]:
    """Each ``name=value``, checked when the pool is applied rather than when a pod starts."""
    from heddle.worker import parse_engine_arg  # noqa: PLC0415 - the worker's rule

    for i, item in enumerate(items):
        if isinstance(item, str) and _SECRET_ARG.match(item):
            raise ManifestError(
                f"{where}[{i}] passes a credential ({item.partition('=')[0]}=...) in the worker "
                "pod's args, which anyone who may read pods can see; put it in a Secret and give "
                "it to the workers as an environment variable (spec.podTemplate, env with "
                "valueFrom.secretKeyRef, e.g. HF_TOKEN)"
            )
        try:
            parse_engine_arg(str(item), f"{where}[{i}]")
        except ConfigError as exc:
            raise ManifestError(str(exc)) from exc
    return tuple(str(a) for a in items)


@dataclass(frozen=True)
class VLLMSpec:
    """vLLM knobs of every engine in the pool."""

    max_model_len: int | None = None  # tokens of context per trajectory; None: the model's own
    gpu_memory_utilization: float = 0.9  # share of GPU memory for weights + KV cache
    extra_args: tuple[str, ...] = ()  # passed to the worker's vLLM engine verbatim


@dataclass(frozen=True)
class EnginePoolSpec:
    """A GPU budget running one model; ``shape`` None: the shape planner decides."""

    name: str
    namespace: str
    model: str
    image: str
    gpus: int
    gpus_per_node: int
    tensor_parallel_sizes: tuple[int, ...]
    shape: PoolShape | None
    vllm: VLLMSpec
    pod: Mapping[str, Any] = field(default_factory=dict)  # resources, podTemplate, ...
    shm_size_limit: str = "16Gi"  # /dev/shm (memory-backed) of each worker, for TP > 1
    speculation: Speculation = field(default_factory=Speculation)  # every engine drafts so

    @classmethod
    def from_manifest(cls, doc: Mapping[str, Any]) -> EnginePoolSpec:
        name, namespace = _metadata(doc, "EnginePool")
        f = Fields(doc.get("spec"), f"EnginePool {name!r} spec")
        gpus = f.integer("gpus", minimum=1)
        per_node = f.integer("gpusPerNode", 8, minimum=1)
        raw_sizes = f.listing("tensorParallelSizes") or [
            tp for tp in (1, 2, 4, 8) if per_node % tp == 0
        ]
        try:
            sizes = check_tp_sizes(raw_sizes, per_node)
        except ConfigError as exc:
            raise ManifestError(f"{f.where('tensorParallelSizes')}: {exc}") from exc
        shape = _shape(f, sizes, gpus)
        v = f.sub("vllm")
        vllm = VLLMSpec(
            max_model_len=(v.integer("maxModelLen", minimum=16) if v.has("maxModelLen") else None),
            gpu_memory_utilization=v.number(
                "gpuMemoryUtilization", 0.9, minimum=0.0, maximum=1.0, exclusive_minimum=True
            ),
            extra_args=_engine_args(v.listing("extraArgs"), v.where("extraArgs")),
        )
        v.done()
        speculation = _speculation(f.sub("speculation"))
        pod = {k: f.raw(k) for k in ("nodeSelector", "tolerations", "volumes", "volumeMounts")}
        pod["resources"] = guaranteed_resources(f.raw("resources"), f.where("resources"))
        pod["podTemplate"] = check_pod_template(f.raw("podTemplate"), f.where("podTemplate"))
        shm = check_quantity(f.raw("shmSizeLimit", "16Gi"), f.where("shmSizeLimit"))
        spec = cls(
            name=name,
            namespace=namespace,
            model=f.string("model", required=True),
            image=f.string("image", "ghcr.io/heddle-dev/heddle-worker:latest"),
            gpus=gpus,
            gpus_per_node=per_node,
            tensor_parallel_sizes=sizes,
            shape=shape,
            vllm=vllm,
            pod={k: v for k, v in pod.items() if v},
            shm_size_limit=shm,
            speculation=speculation,
        )
        f.done()
        return spec


def _speculation(s: Fields) -> Speculation:
    """``spec.speculation``: method, K, and K by batch size (docs/resources.md)."""
    method = s.choice("method", SPECULATION_METHODS, Speculation().method)
    table: list[tuple[int, int, int]] = []
    for i, entry in enumerate(s.listing("byBatchSize")):
        e = Fields(entry, f"{s.where('byBatchSize')}[{i}]")
        table.append(
            (
                e.integer("minBatchSize", minimum=1),
                e.integer("maxBatchSize", minimum=1),
                e.integer("numSpeculativeTokens", minimum=0),
            )
        )
        e.done()
    k = s.integer("numSpeculativeTokens", minimum=1) if s.has("numSpeculativeTokens") else None
    s.done()
    try:
        checked = check_batch_size_table(table, s.where("byBatchSize")) if table else ()
        return Speculation.of(method, k, checked)
    except ConfigError as exc:
        raise ManifestError(f"{s.path}: {exc}") from exc


def _shape(f: Fields, sizes: tuple[int, ...], gpus: int) -> PoolShape | None:
    raw = f.raw("shape")
    if raw is None:
        return None  # the shape planner decides
    where = f.where("shape")
    if not isinstance(raw, list) or not raw:
        raise ManifestError(
            f"{where}={raw!r} must be a list of {{tp, replicas}}; omit it to let the planner decide"
        )
    counts: dict[int, int] = {}
    for i, entry in enumerate(raw):
        e = Fields(entry, f"{where}[{i}]")
        tp = e.integer("tp", minimum=1)
        if tp not in sizes:
            raise ManifestError(f"{e.where('tp')}={tp} is not in tensorParallelSizes {list(sizes)}")
        if tp in counts:
            raise ManifestError(f"{e.where('tp')}={tp} appears twice; give one entry per tp")
        counts[tp] = e.integer("replicas", 1, minimum=1)
        e.done()
    shape = PoolShape.of(counts)
    if shape.gpus > gpus:
        raise ManifestError(
            f"{where} uses {shape.gpus} GPUs but spec.gpus={gpus}; lower the replicas or raise gpus"
        )
    return shape


@dataclass(frozen=True)
class SamplingSpec:
    """``spec.sampling``; the defaults are :data:`heddle.scheduler.SAMPLING_DEFAULTS`."""

    temperature: float = SAMPLING_DEFAULTS.temperature
    top_p: float = SAMPLING_DEFAULTS.top_p
    max_tokens_per_turn: int = SAMPLING_DEFAULTS.max_tokens_per_turn  # one LLM step at most
    max_total_tokens: int = SAMPLING_DEFAULTS.max_total_tokens  # a whole trajectory at most
    # The rollout policy's logprobs in the output: on by default, as off-policy correction
    # (verl, slime, SkyRL, OpenRLHF, AReaL, ROLL) silently fails without them.
    logprobs: bool = True
    seed: int | None = None  # per-trajectory seeds derive from it when set


def _sampling(s: Fields) -> SamplingSpec:
    """Sampling within the engine's ranges: out of them, vLLM fails every step (issue 11)."""
    for name in ("minP", "logitBias"):
        if s.raw(name) is not None:
            raise ManifestError(
                f"{s.where(name)} is not supported: vLLM refuses min_p and logit_bias wherever "
                "speculative decoding is configured (the pool's spec.speculation), so Heddle "
                "takes neither; leave it out and shape sampling with temperature and topP"
            )
    lim, default = SAMPLING_LIMITS, SAMPLING_DEFAULTS
    sampling = SamplingSpec(
        temperature=s.number(
            "temperature",
            default.temperature,
            minimum=lim.temperature_min,
            maximum=lim.temperature_max,
        ),
        top_p=s.number(
            "topP",
            default.top_p,
            minimum=lim.top_p_exclusive_min,
            maximum=lim.top_p_max,
            exclusive_minimum=True,
        ),
        max_tokens_per_turn=s.integer(
            "maxTokensPerTurn", default.max_tokens_per_turn, minimum=lim.max_tokens_min
        ),
        max_total_tokens=s.integer(
            "maxTotalTokens", default.max_total_tokens, minimum=lim.max_tokens_min
        ),
        logprobs=s.boolean("logprobs", SamplingSpec.logprobs),
        seed=(
            s.integer("seed", minimum=lim.seed_min, maximum=lim.seed_max)
            if s.has("seed")
            else s.raw("seed")
        ),
    )
    s.done()
    if sampling.max_tokens_per_turn > sampling.max_total_tokens:
        raise ManifestError(
            f"{s.where('maxTokensPerTurn')}={sampling.max_tokens_per_turn} must be <= "
            f"maxTotalTokens={sampling.max_total_tokens}; lower it or raise maxTotalTokens"
        )
    return sampling


@dataclass(frozen=True)
class ToolEndpointSpec:
    """An HTTP tool: POST ``url`` with ``{"name", "arguments", "trajectory_id"}``."""

    name: str
    url: str
    timeout_s: float = 30.0
    retries: int = 2  # extra attempts after the first


@dataclass(frozen=True)
class ToolsSpec:
    parser: str = "hermes"
    endpoints: tuple[ToolEndpointSpec, ...] = ()
    on_error: str = "message"  # 'message': tell the model; 'fail': end the trajectory
    max_reply_chars: int = 16_384  # longer tool replies are cut (and say so)
    schemas: tuple[Mapping[str, Any], ...] = ()  # OpenAI function tools, for the chat template


@dataclass(frozen=True)
class SyntheticSpec:
    """Turn lengths and tool latencies drawn from a simulator workload."""

    workload: str | Mapping[str, Any]  # preset name, YAML path, or an inline workload
    seed: int = 0
    tool_time_scale: float = 1.0  # multiplies every scripted tool latency


@dataclass(frozen=True)
class ExternalSpec:
    """Agents outside Heddle drive the loop through the job's OpenAI-compatible gateway."""

    tool_parser: str = "hermes"  # reads tool calls from turns whose request lists tools
    idle_timeout_s: float = 300.0  # agent silent this long after a hand-out or a reply: abandoned
    episode_timeout_s: float | None = None  # one hand-out's whole wall time at most, if set
    hand_out_again: int = 0  # times an abandoned episode is handed out afresh before it is written


@dataclass(frozen=True)
class EnvironmentSpec:
    type: str
    tools: ToolsSpec | None = None
    synthetic: SyntheticSpec | None = None
    external: ExternalSpec | None = None
    reward: RewardSpec | None = None  # None: records carry reward null


def _tool_schemas(t: Fields, served: set[str]) -> tuple[Mapping[str, Any], ...]:
    """The job's tool schemas, each an OpenAI function that one of the endpoints serves."""
    schemas = []
    for i, raw in enumerate(t.listing("schemas")):
        where = f"{t.where('schemas')}[{i}]"
        error = tool_schema_error(raw, where)
        if error is not None:
            raise ManifestError(error)
        name = raw["function"]["name"]
        if name not in served:
            raise ManifestError(
                f"{where} describes tool {name!r}, which no endpoint serves; add an endpoint "
                f"named {name!r} or remove the schema (endpoints: {sorted(served)})"
            )
        schemas.append(raw)
    return tuple(schemas)


def _external(e: Fields) -> ExternalSpec:
    spec = ExternalSpec(
        tool_parser=e.choice("toolParser", TOOL_PARSERS, "hermes"),
        idle_timeout_s=e.number("idleTimeoutSeconds", 300.0, exclusive_minimum=True),
        episode_timeout_s=(
            e.number("episodeTimeoutSeconds", exclusive_minimum=True)
            if e.has("episodeTimeoutSeconds")
            else e.raw("episodeTimeoutSeconds")
        ),
        hand_out_again=e.integer("handOutAgain", 0, maximum=100),
    )
    e.done()
    return spec


def _environment(f: Fields) -> EnvironmentSpec:
    kind = f.choice("type", ("tools", "synthetic", "external"), "tools")
    reward = parse_reward(f.sub("reward")) if f.has("reward") else f.raw("reward")
    for other in ("tools", "synthetic", "external"):
        if other != kind and f.has(other):
            # A block of another type would be ignored: say so instead of running without it.
            raise ManifestError(
                f"{f.where(other)} does not apply to environment.type {kind}; remove it, "
                f"or set type: {other}"
            )
        if other != kind:
            f.raw(other)  # null, or absent: nothing to read
    if kind == "external":
        return EnvironmentSpec("external", external=_external(f.sub("external")), reward=reward)
    if kind == "tools":
        t = f.sub("tools")
        endpoints = []
        for i, raw in enumerate(t.listing("endpoints")):
            e = Fields(raw, f"{t.where('endpoints')}[{i}]")
            url = e.string("url", required=True)
            if not url.startswith(("http://", "https://")):
                raise ManifestError(f"{e.where('url')}={url!r} must start with http:// or https://")
            endpoints.append(
                ToolEndpointSpec(
                    name=e.string("name", required=True),
                    url=url,
                    timeout_s=e.number("timeoutSeconds", 30.0, exclusive_minimum=True),
                    retries=e.integer("retries", 2, minimum=0, maximum=MAX_RETRIES),
                )
            )
            e.done()
        names = [e.name for e in endpoints]
        if len(set(names)) != len(names):
            raise ManifestError(f"{t.where('endpoints')}: tool names {names} must be unique")
        tools = ToolsSpec(
            parser=t.choice("parser", TOOL_PARSERS, "hermes"),
            schemas=_tool_schemas(t, set(names)),
            endpoints=tuple(endpoints),
            on_error=t.choice("onError", ON_TOOL_ERROR, "message"),
            max_reply_chars=t.integer("maxReplyChars", 16_384, minimum=1),
        )
        t.done()
        return EnvironmentSpec("tools", tools=tools, reward=reward)
    s = f.sub("synthetic")
    workload = s.required("workload")
    if not isinstance(workload, str | Mapping):
        raise ManifestError(f"{s.where('workload')}={workload!r}: give a preset, a path or a map")
    synthetic = SyntheticSpec(
        workload=workload,
        seed=s.integer("seed", 0),
        tool_time_scale=s.number("toolTimeScale", 1.0),
    )
    s.done()
    return EnvironmentSpec("synthetic", synthetic=synthetic, reward=reward)


@dataclass(frozen=True)
class TasksSpec:
    """Exactly one source of tasks, or none (a synthetic environment draws its own)."""

    inline: tuple[Any, ...] | None = None
    path: str | None = None
    config_map: tuple[str, str] | None = None  # (name, key); the operator resolves it


@dataclass(frozen=True)
class WeightsSpec:
    """The checkpoint every instance serves before the job's first step (loaded in place)."""

    path: str  # a checkpoint directory on a volume the workers mount
    version: str  # written into every output record as weight_version


def _weights(w: Fields) -> WeightsSpec:
    path = w.string("path", required=True)
    version = w.required("version")
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)  # `version: 3` means the RL step; records carry it as text
    if not isinstance(version, str) or not version or len(version) > 253:
        raise ManifestError(
            f"{w.where('version')}={version!r} must be a non-empty string of at most 253 "
            "characters or an integer, e.g. the trainer's step"
        )
    w.done()
    return WeightsSpec(path, version)


# What happens to a trajectory older than the staleness bound when new weights arrive.
PAST_BOUND = ("restart", "finish", "drop")


@dataclass(frozen=True)
class AsynchronySpec:
    """``spec.asynchrony``: weights may change under the running rollout (docs/async.md).

    A trajectory whose oldest step ran on weights more than ``max_staleness_versions``
    pushes ago follows ``past_bound`` at its next step: ``restart`` (afresh, on the new
    weights), ``finish`` (on the new weights; its segments say so) or ``drop`` (written
    as failed, ``finish_reason: past_bound``).
    """

    max_staleness_versions: int = 1
    past_bound: str = "restart"
    # The trainer's batch in GRPO groups (the quota that ends an iteration); None: the
    # session writes every record as it finishes and no iteration is cut.
    groups_per_iteration: int | None = None
    # Groups started beyond the quota, as a fraction of it: up to ceil(quota x (1 + this))
    # groups run that the trainer has not taken (docs/async.md, "Over-sampling").
    over_sample: float = 0.0
    # On a cluster: the session pod serves the trainer API (docs/async.md, "On a
    # cluster"); the session then ends only once a trainer took every group or released.
    trainer_api: bool = False


def _asynchrony(a: Fields) -> AsynchronySpec:
    quota = a.integer("groupsPerIteration", 0, minimum=1) if a.has("groupsPerIteration") else None
    spec = AsynchronySpec(
        max_staleness_versions=a.integer("maxStalenessVersions", 1, minimum=0),
        past_bound=a.choice("pastBound", PAST_BOUND, "restart"),
        groups_per_iteration=quota,
        over_sample=a.number("overSample", 0.0, minimum=0.0, maximum=4.0),
        trainer_api=a.boolean("trainerApi", False),
    )
    if quota is None and a.has("overSample"):
        raise ManifestError(
            f"{a.where('overSample')} needs {a.where('groupsPerIteration')}: over-sampling "
            "starts groups beyond the quota of groups an iteration trains on"
        )
    a.done()
    return spec


@dataclass(frozen=True)
class SessionPodSpec:
    """``spec.session``: the session pod's template (its volumes hold the job's files)."""

    image: str | None = None  # None: the operator's own image
    service_account_name: str | None = None  # None: heddle-session, made by the operator
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    resources: Mapping[str, Any] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


def _named_list(f: Fields, key: str, needs: tuple[str, ...]) -> tuple[Mapping[str, Any], ...]:
    """A list of mappings, each with the fields ``needs`` names (a volume's name, ...)."""
    entries = f.listing(key)
    for i, entry in enumerate(entries):
        where = f"{f.where(key)}[{i}]"
        if not isinstance(entry, Mapping):
            raise ManifestError(f"{where}={entry!r} must be a mapping")
        for k in needs:
            if not isinstance(entry.get(k), str) or not entry[k]:
                raise ManifestError(f"{where} needs {k} (a non-empty string)")
    return tuple(dict(e) for e in entries)


def _session_pod(f: Fields) -> SessionPodSpec:
    image = f.optional_string("image")
    account = f.optional_string("serviceAccountName")
    volumes = _named_list(f, "volumes", ("name",))
    mounts = _named_list(f, "volumeMounts", ("name", "mountPath"))
    names = {str(v["name"]) for v in volumes}
    for i, m in enumerate(mounts):
        if m["name"] not in names:
            raise ManifestError(
                f"{f.where('volumeMounts')}[{i}] mounts volume {m['name']!r}, which "
                f"{f.where('volumes')} does not define; known: {sorted(names)}"
            )
    resources = f.raw("resources", {})
    if not isinstance(resources, Mapping):
        raise ManifestError(f"{f.where('resources')} must be a mapping (requests, limits)")
    for part, values in resources.items():
        if part not in ("requests", "limits") or not isinstance(values, Mapping):
            raise ManifestError(
                f"{f.where('resources')}.{part} is not one of requests, limits (a mapping each)"
            )
        for k, v in values.items():
            check_quantity(v, f"{f.where('resources')}.{part}.{k}")
    selector = f.raw("nodeSelector", {})
    if not isinstance(selector, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
    ):
        raise ManifestError(f"{f.where('nodeSelector')} must map label names to strings")
    tolerations = _named_list(f, "tolerations", ())
    f.done()
    return SessionPodSpec(
        image, account, volumes, mounts, dict(resources), dict(selector), tolerations
    )


@dataclass(frozen=True)
class RolloutJobSpec:
    name: str
    namespace: str
    engine_pool: str
    tasks: TasksSpec
    samples_per_task: int
    sampling: SamplingSpec
    environment: EnvironmentSpec
    max_turns: int
    policy: str
    replan_interval_s: float
    output_path: str
    deadline_s: float | None
    weights: WeightsSpec | None = None
    asynchrony: AsynchronySpec | None = None  # None: the weights never change mid-rollout
    session: SessionPodSpec = field(default_factory=SessionPodSpec)
    # Also write the token trace beside the output (trace_path(); docs/workloads.md).
    output_trace: bool = False

    @classmethod
    def from_manifest(cls, doc: Mapping[str, Any]) -> RolloutJobSpec:
        name, namespace = _metadata(doc, "RolloutJob")
        f = Fields(doc.get("spec"), f"RolloutJob {name!r} spec")
        environment = _environment(f.sub("environment"))
        tasks = _tasks(f.sub("tasks"), environment)
        sampling = _sampling(f.sub("sampling"))
        g = f.sub("scheduling")
        policy = g.string("policy", "heddle")
        if policy not in POLICIES or policy in SIMULATION_ONLY:
            valid = sorted(p for p in POLICIES if p not in SIMULATION_ONLY)
            raise ManifestError(f"{g.where('policy')}={policy!r}; choose one of {valid}")
        replan = g.number("replanIntervalSeconds", REPLAN_INTERVAL_S, exclusive_minimum=True)
        g.done()
        o = f.sub("output")
        output_path = o.string("path", required=True)
        output_trace = o.boolean("trace", False)
        o.done()
        deadline = (
            f.number("deadlineSeconds", exclusive_minimum=True)
            if f.has("deadlineSeconds")
            else f.raw("deadlineSeconds")
        )
        spec = cls(
            name=name,
            namespace=namespace,
            engine_pool=f.string("enginePool", required=True),
            tasks=tasks,
            samples_per_task=f.integer(
                "samplesPerTask", 1, minimum=1, maximum=MAX_SAMPLES_PER_TASK
            ),
            sampling=sampling,
            environment=environment,
            max_turns=f.integer("maxTurns", 8, minimum=1),
            policy=policy,
            replan_interval_s=replan,
            output_path=output_path,
            deadline_s=deadline,
            weights=_weights(f.sub("weights")) if f.has("weights") else None,
            asynchrony=_asynchrony(f.sub("asynchrony")) if f.has("asynchrony") else None,
            session=_session_pod(f.sub("session")),
            output_trace=output_trace,
        )
        f.done()
        return spec


def _tasks(t: Fields, environment: EnvironmentSpec) -> TasksSpec:
    sources = [k for k in ("inline", "path", "configMap") if t.has(k)]
    if len(sources) > 1:
        raise ManifestError(f"{t.path}: give one of inline, path or configMap, not {sources}")
    if not sources and environment.type != "synthetic":
        raise ManifestError(
            f"{t.path}: give tasks (inline: [...], path: tasks.jsonl or configMap: "
            "{name, key}); only a synthetic environment can go without"
        )
    spec = TasksSpec()
    if t.has("inline"):
        spec = TasksSpec(inline=tuple(t.listing("inline")))
    elif t.has("path"):
        spec = TasksSpec(path=t.string("path"))
    elif t.has("configMap"):
        c = t.sub("configMap")
        spec = TasksSpec(
            config_map=(c.string("name", required=True), c.string("key", "tasks.jsonl"))
        )
        c.done()
    t.done()
    return spec


def load_manifests(path: Path) -> list[dict[str, Any]]:
    """Every document of a YAML file, each checked for apiVersion and kind."""
    text = read_text(path, "manifest", "fix the file name", ManifestError)
    docs = [d for d in safe_load_all(text, str(path), ManifestError) if d is not None]
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise ManifestError(f"{path} document {i + 1} is not a mapping")
        # Not quoted: until apiVersion and kind match, the file may be anything (a kubeconfig).
        if doc.get("apiVersion") != API_VERSION:
            raise ManifestError(
                f"{path} document {i + 1} is not a Heddle manifest; use {API_VERSION!r} "
                "as its apiVersion"
            )
        if doc.get("kind") not in ("EnginePool", "RolloutJob"):
            raise ManifestError(
                f"{path} document {i + 1} is not a Heddle manifest; use kind EnginePool or "
                "RolloutJob"
            )
    return docs
