"""``heddle run``: a RolloutJob on local workers, no cluster needed.

Reads the same manifests a user would ``kubectl apply``: the RolloutJob, and
its EnginePool from ``--pool`` or from the job's own file. Relative paths in
the job (tasks, output, a workload file, the checkpoint of ``spec.weights``)
resolve against the job file's folder. ``model: tiny`` in the pool means the
random-weight model that ``heddle model tiny`` writes (generated once into
``.heddle/models/tiny``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from heddle.api import EnginePoolSpec, RolloutJobSpec, check_trajectories, load_manifests
from heddle.exceptions import ManifestError, OutputError
from heddle.scheduler import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    PerfModel,
    PoolShape,
    ProfiledPerfModel,
    WorkloadSpec,
    get_policy,
    load_profile,
)
from heddle.worker import Speculation, WorkerEndpoint

from ._colocation import (
    ColocationVerdict,
    apply_colocation,
    live_colocation,
)
from ._decide import decide_ahead, decide_run
from ._decided import (
    DecidedRun,
    DecisionCache,
    PoolPlan,
)
from ._drafts_feed import DRAFTING_METHODS, DraftsFeed, pool_corpus
from ._environments import Environment, SyntheticEnvironment, synthetic_tasks
from ._external import ExternalEnvironment
from ._gateway import Gateway
from ._hosts import LOCAL_DEFAULT, HostAllowList, check_tool_hosts
from ._job import LocalJob
from ._local import LocalPool, LocalWorkerOptions, is_tiny_model, local_speculation
from ._output import OutputSink
from ._presets import WORKLOAD_PRESETS, load_workload
from ._previous import PreviousRollouts, finished_records
from ._progress import Progress, SessionMetrics
from ._reward_stats import read_output_records, reward_stats
from ._rewards import make_scorer
from ._seed_gate import SeedGate
from ._session import RolloutSession, SessionConfig, SessionResult
from ._tasks import TaskSet, read_tasks
from ._tools import ToolsEnvironment
from ._trainer_api import END_LINGER_S, TrainerServer

__all__ = [
    "GATEWAY_TOKEN_ENV",
    "GatewayOptions",
    "LocalJob",
    "PoolPlan",
    "ProgressPrinter",
    "build_session",
    "gateway_file",
    "job_workload",
    "perf_model_for",
    "prepare_job",
    "prepare_manifests",
    "read_job_tasks",
    "resolve_job",
    "run_local",
    "serve_trainer",
    "session_config_for",
    "trace_path",
    "trainer_file",
]

log = logging.getLogger("heddle.run")

GATEWAY_TOKEN_ENV = "HEDDLE_GATEWAY_TOKEN"  # an external job's token, instead of a fresh one


@dataclass(frozen=True)
class GatewayOptions:
    """Where an external job's gateway listens locally (port 0: a free one)."""

    host: str = "127.0.0.1"
    port: int = 0
    linger_s: float = 3.0  # served on after the job ends, so polling agents hear it ended


def _pick(
    docs: Sequence[Mapping[str, Any]], kind: str, name: str | None, source: str
) -> Mapping[str, Any]:
    found = [d for d in docs if d.get("kind") == kind]
    if name is not None:
        found = [d for d in found if (d.get("metadata") or {}).get("name") == name]
    if len(found) != 1:
        what = f"{kind} {name!r}" if name else kind
        raise ManifestError(
            f"{source}: expected one {what}, found {len(found)}; "
            + ("pass --pool POOL.yaml" if kind == "EnginePool" else "pass --job NAME")
        )
    return found[0]


def job_workload(spec: RolloutJobSpec, locate: Callable[[str], Path]) -> WorkloadSpec | None:
    """The synthetic environment's workload: inline, a preset, or a file ``locate`` finds."""
    synthetic = spec.environment.synthetic
    if synthetic is None:
        return None
    if isinstance(synthetic.workload, Mapping):
        return WorkloadSpec.from_dict(
            dict(synthetic.workload), "spec.environment.synthetic.workload"
        )
    name = synthetic.workload
    if name in WORKLOAD_PRESETS:
        return load_workload(name)
    return load_workload(str(locate(name)))


def prepare_job(
    job_path: Path, pool_path: Path | None = None, job_name: str | None = None
) -> LocalJob:
    """Parse and resolve everything a local run needs; no processes start here."""
    docs = load_manifests(job_path)
    pool_docs = load_manifests(pool_path) if pool_path is not None else docs
    return prepare_manifests(
        docs, pool_docs, job_name, base=job_path.parent, sources=(job_path, pool_path or job_path)
    )


def prepare_manifests(
    docs: Sequence[Mapping[str, Any]],
    pool_docs: Sequence[Mapping[str, Any]],
    job_name: str | None = None,
    *,
    base: Path,
    sources: tuple[object, object] = ("the job", "the pool"),
) -> LocalJob:
    """:func:`prepare_job` on manifests already parsed; relative paths resolve against ``base``."""
    job = RolloutJobSpec.from_manifest(_pick(docs, "RolloutJob", job_name, str(sources[0])))
    # Locally the user's own rights are at stake, not an operator's: loopback by default.
    allowed = HostAllowList.from_env(default=LOCAL_DEFAULT)
    check_tool_hosts(job, allowed)
    pool = EnginePoolSpec.from_manifest(
        _pick(pool_docs, "EnginePool", job.engine_pool, str(sources[1]))
    )
    if job.tasks.config_map is not None:
        raise ManifestError(
            f"RolloutJob {job.name!r}: tasks.configMap needs the operator on a cluster; "
            "locally, use tasks.path (a JSONL file) or tasks.inline"
        )
    return resolve_job(job, pool, None, base, tool_hosts=allowed)


def read_job_tasks(job: RolloutJobSpec, base: Path) -> TaskSet | None:
    """The job's inline or JSONL tasks (relative paths against ``base``); None: neither."""
    if job.tasks.inline is not None:
        return read_tasks(inline=job.tasks.inline)
    if job.tasks.path is not None:
        path = Path(job.tasks.path)
        return read_tasks(path=path if path.is_absolute() else base / path)
    return None


def resolve_job(
    job: RolloutJobSpec,
    pool: EnginePoolSpec,
    tasks: TaskSet | None,
    base: Path,
    *,
    tool_hosts: HostAllowList | None = None,
) -> LocalJob:
    """Everything a session needs from a job and its pool, wherever it runs.

    ``tasks`` None: the job's inline or JSONL tasks, else the synthetic workload's
    prompts. Relative paths (tasks, workload file, output, checkpoint) resolve
    against ``base``: the job file's folder for ``heddle run``, the session pod's
    working folder on a cluster.
    """
    workload = job_workload(job, lambda name: base / name)  # an absolute name stays as it is
    if tasks is None:
        tasks = read_job_tasks(job, base)
    if tasks is None or (not tasks.tasks and workload is not None):
        assert workload is not None  # the manifest parser allows no tasks only for synthetic
        check_trajectories(workload.prompts, job.samples_per_task, f"RolloutJob {job.name!r}")
        tasks = TaskSet(
            synthetic_tasks(
                workload.prompts,
                workload,
                job.environment.synthetic.seed if job.environment.synthetic else 0,
            ),
            [],
        )
    check_trajectories(len(tasks.tasks), job.samples_per_task, f"RolloutJob {job.name!r}")
    if job.weights is not None and not Path(job.weights.path).is_absolute():
        job = replace(job, weights=replace(job.weights, path=str(base / job.weights.path)))
    output = Path(job.output_path)
    return LocalJob(
        job, pool, tasks, workload, output if output.is_absolute() else base / output, base,
        tool_hosts if tool_hosts is not None else HostAllowList(),
    )  # fmt: skip


def perf_model_for(pool: EnginePoolSpec, options: LocalWorkerOptions | None = None) -> PerfModel:
    """The planner's performance model.

    Local vLLM workers on the tiny model (``options``: vLLM's CPU build here) plan
    with the shipped engine profile measured on them (``vllm-cpu-tiny``, at the
    workers' batch cap): a datasheet model of an H100 is off by orders of magnitude
    there. Only where the profile measured a TP degree the pool may use and every
    pinned one (it holds TP1 only). Otherwise the pool's model if it is a preset,
    else Qwen3-8B, on an H100.
    """
    if options is not None and options.engine == "vllm" and is_tiny_model(options.model):
        profile = load_profile("vllm-cpu-tiny")
        pinned = set(pool.shape.tps()) if pool.shape is not None else set()
        usable = set(pool.tensor_parallel_sizes) & set(profile.tps)
        if usable and pinned <= set(profile.tps):
            return ProfiledPerfModel.from_profile(profile, batch_cap=options.max_num_seqs)
    lowered = pool.model.lower()
    model = next((m for m in MODEL_PRESETS if m in lowered), "qwen3-8b")
    return PerfModel(MODEL_PRESETS[model], HARDWARE_PRESETS["h100-sxm"])


def build_environment(local: LocalJob) -> Environment:
    environment = _environment(local)
    environment.reward = make_scorer(local.job.environment.reward, local.tool_hosts)
    return environment


def _environment(local: LocalJob) -> Environment:
    env = local.job.environment
    if env.type == "synthetic":
        assert env.synthetic is not None and local.workload is not None
        return SyntheticEnvironment(
            local.workload,
            len(local.tasks.tasks),
            local.job.samples_per_task,
            seed=env.synthetic.seed,
            tool_time_scale=env.synthetic.tool_time_scale,
            max_turns=local.job.max_turns,
        )
    if env.type == "external":
        assert env.external is not None
        return ExternalEnvironment(env.external, job=local.job.name, model=local.pool.model,
                                   token=os.environ.get(GATEWAY_TOKEN_ENV) or None)  # fmt: skip
    assert env.tools is not None
    return ToolsEnvironment(env.tools, allowed=local.tool_hosts)


class ProgressPrinter:
    """One rewritten line on a terminal; a line every ``every_s`` seconds elsewhere."""

    def __init__(self, label: str, stream: TextIO = sys.stderr, every_s: float = 10.0) -> None:
        self.label = label
        self.stream = stream
        self.tty = stream.isatty()
        self.every_s = every_s
        self._last = -every_s

    def __call__(self, p: Progress) -> None:
        if self.tty:
            total = max(1, p.total)
            bar = "#" * int(24 * (p.done + p.failed) / total)
            self.stream.write(f"\r{self.label} [{bar:<24s}] {p.line()}\x1b[K")
            self.stream.flush()
        elif p.elapsed_s - self._last >= self.every_s or p.done + p.failed == p.total:
            self._last = p.elapsed_s
            self.stream.write(f"{self.label}: {p.line()}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


def summary_of(
    local: LocalJob,
    shape: PoolShape,
    result: SessionResult,
    engine: str,
    scheduling: str | None = None,
    decided: DecidedRun | None = None,
) -> dict[str, Any]:
    p = result.progress
    colocation = None if decided is None else decided.colocation
    policy = get_policy(scheduling or local.job.policy)
    return {
        "job": local.job.name,
        "policy": local.job.policy,
        "scheduling": scheduling or local.job.policy,  # the planner's fallback, if it took one
        "pool": {"name": local.pool.name, "shape": str(shape), "engine": engine},
        "output": str(local.output),
        "progress": p.as_dict(),
        "tokens_per_s_overall": p.tokens / p.elapsed_s if p.elapsed_s > 0 else 0.0,
        "steps": result.steps,
        "migrations": result.migrations,
        "recomputes": result.recomputes,
        "worker_failures": result.worker_failures,
        "mechanisms": {
            "predictor": policy.predictor or "none",
            "re_predictions": result.steps if policy.predictor else 0,
            "promotions": result.promotions,
            "ordering": policy.ordering,
            "placement": policy.placement,
            "replans": result.replans,
            "migration": policy.migration,
            "migrations": result.migrations,
            "recomputes": result.recomputes,
            "shape": str(shape),
            "shape_source": "pinned in the pool" if local.pool.shape is not None else "planned",
        },
        "deadline_hit": result.deadline_hit,
        # Seconds the shape planner and the co-location decision took before the pool
        # started (the simulator charges the same: SimResult.decisions_s); 0 where an
        # earlier run's were reused ("decisions": its key, and what deciding took then).
        "decisions_s": 0.0 if decided is None else decided.took_s,
        # Trajectories of the pool's previous rollout the predictor and the decisions
        # started from (0: the predictor's prior; rollout/_previous.py).
        "history_records": len(local.history),
        **(
            {
                "decisions": {
                    "key": decided.key,
                    "reused": decided.reused,
                    "decided_s": decided.decided_s,
                }
            }
            if decided is not None
            else {}
        ),
        **({"drafts": result.drafts} if result.drafts is not None else {}),
        # Whether GRPO groups were kept whole (the simulator's decision); absent where it
        # was not asked (speculation off, or one sample per task).
        **({"colocation": colocation.as_dict()} if colocation is not None else {}),
        "rewards": _rewards_of(local),
        "malformed_tasks": [str(e) for e in local.tasks.errors],
        "failures": result.failures,
    }


def _rewards_of(local: LocalJob) -> dict[str, Any] | None:
    """The output's reward figures, where the job scores its trajectories."""
    env = local.job.environment
    if env.reward is None and env.type != "external":  # an external agent may report one
        return None
    if not local.output.exists():
        return None
    return reward_stats(read_output_records(local.output))


async def run_local(
    local: LocalJob,
    options: LocalWorkerOptions,
    *,
    on_progress: Any = None,
    session_config: SessionConfig | None = None,
    metrics: SessionMetrics | None = None,
    gateway: GatewayOptions | None = None,
    on_gateway: Callable[[str, str], None] | None = None,
    trainer: GatewayOptions | None = None,
    on_trainer: Callable[[str, str], None] | None = None,
    decisions: DecisionCache | None = None,
    history: PreviousRollouts | None = None,
    ahead: bool = False,
) -> tuple[dict[str, Any], SessionResult]:
    """Start the pool, run the session, stop the pool (also on error or cancellation).

    ``decisions``: where the start-up decisions are kept and reused from (``heddle run``:
    ``.heddle/decisions``); None: decided afresh, kept nowhere. ``history``: where the
    pool's previous rollout is read from and this one kept (``.heddle/history``;
    rollout/_previous.py); None: the job's own ``history`` only. ``ahead`` (with both):
    once the rollout ends, the next iteration's decisions are taken in the background on
    it (:func:`decide_ahead`; the Python client's in-process runs).

    An ``external`` job serves its gateway meanwhile: ``on_gateway(url, token)``
    hears where, and ``OUTPUT.gateway.json`` (readable by its owner only) says it too.
    With ``trainer`` the session serves its trainer API (docs/async.md, "Streaming
    groups"): a trainer takes the finished groups; ``on_trainer(url, token)`` and
    ``OUTPUT.trainer.json`` say where.
    """
    perf = perf_model_for(local.pool, options)
    if history is not None and not local.history:
        local = replace(local, history=history.get(local.pool.name))
    # What the workers will draft with (auto is off on vLLM's CPU build): the decisions
    # simulate that, and the drafts feed runs only where they draft.
    speculation = local_speculation(options)
    decided = decide_run(local, perf, speculation, cache=decisions)
    plan, colocation = decided.plan, decided.colocation
    shape = plan.shape
    # Locked and checked before any worker starts: a second run on this output stops here.
    sink = OutputSink(local.output)
    sink.open()
    if local.job.weights is not None:  # the checkpoint's folder: the trainer saves steps there
        folder = str(Path(local.job.weights.path).parent)
        options = replace(options, weights_roots=(*options.weights_roots, folder))
    pool = LocalPool(shape.tps(), options)
    served: Gateway | None = None
    trainer_api: TrainerServer | None = None
    session_ended = False
    interrupted = False  # a cancel (Ctrl-C) during the lingers below: cut them, then go on
    try:
        workers = await pool.start()
        environment = build_environment(local)
        if isinstance(environment, ExternalEnvironment):
            served = await _serve_gateway(local, environment, gateway or GatewayOptions())
            if on_gateway is not None:
                on_gateway(served.url, environment.token)
        session = build_session(
            local,
            workers,
            sink,
            plan=plan,
            perf=perf,
            environment=environment,
            config=session_config,
            on_progress=on_progress,
            metrics=metrics,
            speculation=speculation,
            colocation=colocation,
        )
        if trainer is not None:
            trainer_api = await serve_trainer(session, local, trainer)
            if on_trainer is not None:
                on_trainer(trainer_api.url, trainer_api.token)
        result = await session.run()
        session_ended = True
        if history is not None:  # what the pool's next session starts from
            history.put(local.pool.name, finished_records(session.runs.values()))
            if ahead and decisions is not None:  # the next iteration's, as it will read it
                kept = history.get(local.pool.name)
                decide_ahead(replace(local, history=kept), perf, speculation, decisions,
                             decided.decided_s)  # fmt: skip
    finally:
        sink.close()  # the session closed it already unless it never ran
        if trainer_api is not None:  # after a clean end, until the trainer heard it
            linger_s = END_LINGER_S if session_ended else 0.0
            try:  # a cancel cuts the linger; the server stops before stop() passes it on
                await trainer_api.stop(linger_s)
            except asyncio.CancelledError:
                interrupted = True
            trainer_file(local.output).unlink(missing_ok=True)
        if served is not None:
            if session_ended and not interrupted:  # on Ctrl-C or an error it goes at once
                try:
                    await asyncio.sleep((gateway or GatewayOptions()).linger_s)
                except asyncio.CancelledError:
                    interrupted = True
            await asyncio.shield(served.stop())
            gateway_file(local.output).unlink(missing_ok=True)  # an agent never finds a stale one
        await asyncio.shield(pool.stop())
    summary = summary_of(local, shape, result, options.engine, plan.policy, decided)
    summary_path = local.output.with_name(local.output.name + ".summary.json")
    try:
        summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"cannot write the summary {summary_path}: {exc.strerror}") from exc
    if interrupted:  # the run had ended and its summary is written; the cancel goes on
        raise asyncio.CancelledError
    return summary, result


def build_session(
    local: LocalJob,
    workers: Sequence[WorkerEndpoint],
    sink: OutputSink,
    *,
    plan: PoolPlan,
    perf: PerfModel,
    environment: Environment | None = None,
    config: SessionConfig | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    metrics: SessionMetrics | None = None,
    weight_versions: dict[str, str] | None = None,
    speculation: Speculation | None = None,
    colocation: ColocationVerdict | None = None,
) -> RolloutSession:
    """The one way from (job, pool, tasks, workers) to a session: ``heddle run``, the
    session pod (``heddle session``) and the benchmarks all build it here.

    With ``spec.output.trace`` the token trace goes to :func:`trace_path` of the output,
    written by a sink like the output's (locked, resumed, never a torn line).
    Where the engines speculate with ``suffix`` or ``auto`` (``speculation``, else the
    pool's), the session feeds them siblings' and earlier iterations' texts
    (:class:`DraftsFeed`, the history kept per pool in this process: :func:`pool_corpus`),
    each text only where inserting it pays (:class:`SeedGate`, the simulator's decision);
    and keeps GRPO groups whole on one engine where the simulator's co-location decision
    takes it (``colocation``: decided here unless given; rollout/_colocation.py).
    """
    for error in local.tasks.errors:
        log.warning("skipping a malformed task: %s", error)
    trace = (
        OutputSink(trace_path(local.output), follow_symlinks=sink.follow_symlinks)
        if local.job.output_trace
        else None
    )
    if colocation is None:
        colocation = live_colocation(
            local, plan.shape, plan.policy, plan.max_trajectories_in_flight, perf, speculation
        )
    session = RolloutSession(
        job=local.job.name,
        tasks=local.tasks.tasks,
        samples_per_task=local.job.samples_per_task,
        environment=environment if environment is not None else build_environment(local),
        workers=workers,
        sink=sink,
        perf=perf,
        sampling=local.job.sampling,
        max_turns=local.job.max_turns,
        policy=plan.policy,
        deadline_s=local.job.deadline_s,
        malformed_tasks=len(local.tasks.errors),
        config=session_config_for(local.job, config),
        on_progress=on_progress,
        metrics=metrics,
        weights=local.job.weights,
        asynchrony=local.job.asynchrony,
        weight_versions=weight_versions,
        max_trajectories_in_flight=plan.max_trajectories_in_flight,
        trace=trace,
        drafts=drafts_feed_for(local, speculation, perf),
        history=local.history,  # the pool's previous rollout seeds the predictor
    )
    apply_colocation(session, colocation)
    return session


def drafts_feed_for(
    local: LocalJob, speculation: Speculation | None = None, perf: PerfModel | None = None
) -> DraftsFeed | None:
    """The drafting corpus's feed where the engines draft from other texts (suffix, auto);
    with ``perf``, each insertion decided as the simulator decides it (:class:`SeedGate`)."""
    method = (speculation or local.pool.speculation).method
    if method not in DRAFTING_METHODS:
        return None
    gate = SeedGate(perf) if perf is not None else None
    return DraftsFeed(local.job.name, pool_corpus(local.pool.name), gate=gate)


def session_config_for(job: RolloutJobSpec, base: SessionConfig | None = None) -> SessionConfig:
    """``base`` (the operator's or the CLI's session settings) with the fields a RolloutJob
    may set taken from the job: the one place where a job overrides them. The session pod
    always passes the operator's settings, so a job value applied only when no ``base`` is
    given would be silently ignored on a cluster."""
    return replace(base or SessionConfig(), replan_interval_s=job.replan_interval_s)


def trace_path(output: Path) -> Path:
    """Where the token trace of an output goes: ``rollout.jsonl`` -> ``rollout.trace.jsonl``."""
    return output.with_name(output.stem + ".trace.jsonl")


def _write_owner_only(path: Path, data: dict[str, Any]) -> None:
    """``data`` as one JSON line, readable by its owner only (it holds a token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.write("\n")


def trainer_file(output: Path) -> Path:
    """Where a local run serving the trainer API writes its URL and token."""
    return output.with_name(output.name + ".trainer.json")


async def serve_trainer(
    session: RolloutSession, local: LocalJob, options: GatewayOptions
) -> TrainerServer:
    """The session's trainer API, and ``OUTPUT.trainer.json`` (owner-only) saying where."""
    server = TrainerServer(session, host=options.host, port=options.port)
    url = await server.start()
    path = trainer_file(local.output)
    try:
        _write_owner_only(path, {"job": local.job.name, "url": url, "token": server.token})
    except OSError as exc:
        await server.stop()
        raise OutputError(f"cannot write the trainer API file {path}: {exc.strerror}") from exc
    return server


def gateway_file(output: Path) -> Path:
    """Where a local external job writes its gateway's URL and token."""
    return output.with_name(output.name + ".gateway.json")


async def _serve_gateway(
    local: LocalJob, environment: ExternalEnvironment, options: GatewayOptions
) -> Gateway:
    served = Gateway(environment, options.host, options.port)
    url = await served.start()
    path = gateway_file(local.output)
    try:
        _write_owner_only(path, {"job": local.job.name, "url": url, "token": environment.token,
                                 "model": environment.model})  # fmt: skip
    except OSError as exc:
        await served.stop()
        raise OutputError(f"cannot write the gateway file {path}: {exc.strerror}") from exc
    return served
