"""The vLLM engine: an in-process ``AsyncLLM`` with prefix caching and priority scheduling.

vLLM is imported when the engine starts, so ``heddle.worker`` imports without
it (``make setup`` installs vLLM's CPU build; GPU images ship ``vllm``).
"""

from __future__ import annotations

import asyncio
import difflib
import itertools
import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from heddle.exceptions import CheckpointError, ConfigError, EngineInputError
from heddle.scheduler import ENGINE_BATCH_CAP

from ._auto_speculation import auto_speculation
from ._engine import Engine, EngineError, EngineStats, ParsedTurn, Sampling, StepOutput
from ._engine_arg_names import VLLM_ENGINE_ARG_NAMES, VLLM_LINE
from ._environment import is_cpu_build
from ._speculation import NO_SPECULATION, Speculation
from ._tool_parsing import VLLMToolParsers
from ._vllm_env import vllm_cpu_env
from ._weights import CheckpointLayout, LoadedWeights, check_compatible, checkpoint_layout

__all__ = [
    "PROTECTED_ENGINE_ARGS",
    "VLLMConfig",
    "VLLMEngine",
    "engine_kwargs",
    "parse_engine_arg",
]

# Engine arguments Heddle sets from elsewhere or depends on; extraArgs may not change them.
PROTECTED_ENGINE_ARGS = {
    "model": "set the model with spec.model",
    "tensor_parallel_size": "the TP degree comes from the pool's shape",
    "scheduling_policy": "Heddle's priorities need 'priority'",
    "enable_prefix_caching": "trajectory-resident contexts need the prefix cache",
    "speculative_config": "set speculation with --speculation (the pool's spec.speculation)",
    "worker_extension_cls": "Heddle's vLLM fixes and draft seeding need its own extension",
    "per_request_spec_decode_metrics": "Heddle reports drafted and accepted tokens per step",
}

# vLLM imports it in every worker process: it applies heddle.worker._vllm_patches there.
WORKER_EXTENSION = "heddle.worker._vllm_extension.HeddleWorkerExtension"
# How long /v1/state waits for the measured K table (one collective_rpc between engine
# steps) before it shows the start-up table instead.
K_STATE_TIMEOUT_S = 5.0


# vLLM's refusal of a max_model_len above the model's ("User-specified max_model_len
# (65536) is greater than the derived max_model_len (max_position_embeddings=8192 ...").
_MAX_LEN_REFUSED = re.compile(
    r"max_model_len \((?P<asked>\d+)\) is greater than the derived max_model_len "
    r"\(\w+=(?P<own>[\d.]+)"
)


@dataclass(frozen=True)
class VLLMConfig:
    """What the worker passes to vLLM. ``kv_cache_gib`` applies to the CPU build only."""

    model: str
    tp: int = 1
    max_model_len: int | None = None  # None: the model's own context length
    gpu_memory_utilization: float = 0.9
    block_size: int | None = None  # KV block size; smaller blocks cache finer prefixes
    max_num_seqs: int = ENGINE_BATCH_CAP  # the batch cap
    enforce_eager: bool | None = None  # None: on the CPU build only (GPUs capture CUDA graphs)
    dtype: str = "auto"
    kv_cache_gib: int = 1
    seed: int = 0
    engine_args: tuple[tuple[str, Any], ...] = ()  # more vLLM engine args (EnginePool extraArgs)
    speculation: Speculation = NO_SPECULATION  # drafting method and K (EnginePool speculation)


def parse_engine_arg(text: str, where: str = "--vllm-arg") -> tuple[str, Any]:
    """``name=value`` of one vLLM engine argument (``--max-num-seqs=8`` works too).

    The value is parsed as JSON when it is JSON (numbers, booleans, lists),
    else kept as a string; a protected name is refused with the reason.
    """
    name, sep, raw = text.partition("=")
    name = name.strip().lstrip("-").replace("-", "_")
    if not sep or not name:
        raise ConfigError(
            f"{where} {text!r}: write it as name=value, e.g. max_num_batched_tokens=8192"
        )
    if name in PROTECTED_ENGINE_ARGS:
        raise ConfigError(f"{where} {name!r} cannot be set: {PROTECTED_ENGINE_ARGS[name]}")
    if name not in VLLM_ENGINE_ARG_NAMES:
        close = difflib.get_close_matches(name, sorted(VLLM_ENGINE_ARG_NAMES), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"{where} {name!r} is not an engine argument of vLLM {VLLM_LINE} "
            f"(vllm.engine.arg_utils.EngineArgs){hint}"
        )
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return name, value


def engine_kwargs(config: VLLMConfig, *, cpu_build: bool) -> dict[str, Any]:
    """vLLM's engine arguments: Heddle's defaults, then the pool's extraArgs over them.

    Defaults differ by build: the CPU build runs eagerly, a GPU captures CUDA
    graphs (several times faster decode). Any other engine argument may be
    overridden (``max_num_seqs``, ``enforce_eager``, ...); those in
    :data:`PROTECTED_ENGINE_ARGS` are refused with the reason.
    """
    for name, _ in config.engine_args:
        if name in PROTECTED_ENGINE_ARGS:
            raise ConfigError(
                f"vLLM engine argument {name!r} cannot be set: {PROTECTED_ENGINE_ARGS[name]}"
            )
    kwargs: dict[str, Any] = {
        "model": config.model,
        "tensor_parallel_size": config.tp,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "max_num_seqs": config.max_num_seqs,
        "enforce_eager": cpu_build if config.enforce_eager is None else config.enforce_eager,
        "dtype": config.dtype,
        "seed": config.seed,
        "enable_prefix_caching": True,
        "scheduling_policy": "priority",
        "worker_extension_cls": WORKER_EXTENSION,
    }
    speculative = engine_speculation(config, cpu_build=cpu_build)[0].vllm_config()
    if speculative is not None:
        kwargs["speculative_config"] = speculative
        # Drafted and accepted tokens on each request's final output (summary counts).
        kwargs["per_request_spec_decode_metrics"] = "summary"
    if config.max_model_len is not None:  # else vLLM derives the model's own
        kwargs["max_model_len"] = config.max_model_len
    if config.block_size is not None:
        kwargs["block_size"] = config.block_size
    kwargs.update(dict(config.engine_args))
    return kwargs


def engine_speculation(config: VLLMConfig, *, cpu_build: bool) -> tuple[Speculation, str]:
    """How the engine speculates (``auto`` resolved, with its K table), and a line why."""
    return auto_speculation(
        config.speculation,
        model=config.model,
        tp=config.tp,
        max_num_seqs=engine_max_num_seqs(config),
        max_model_len=config.max_model_len,
        cpu_build=cpu_build,
    )


def engine_max_num_seqs(config: VLLMConfig) -> int:
    """The engine's batch cap: the pool's, or an engine argument that overrides it."""
    return int(dict(config.engine_args).get("max_num_seqs", config.max_num_seqs))


def _engine_core_times(stats: Any) -> tuple[float, float | None, float | None]:
    """(queue, prefill, decode) seconds from vLLM's per-request stats (engine core clock).

    ``queued_ts``, ``scheduled_ts``, ``first_token_ts`` and ``last_token_ts`` are
    the engine core's ``time.monotonic()``: the waiting queue is only visible
    there (the API process sees one wait from submission to first token).
    Prefill and decode are ``None`` when vLLM kept no stats for the request.
    """
    if stats is None:
        return 0.0, None, None
    queued = float(getattr(stats, "queued_ts", 0.0) or 0.0)
    scheduled = float(getattr(stats, "scheduled_ts", 0.0) or 0.0)
    first = float(getattr(stats, "first_token_ts", 0.0) or 0.0)
    last = float(getattr(stats, "last_token_ts", 0.0) or 0.0)
    queue_s = max(0.0, scheduled - queued) if queued and scheduled else 0.0
    if not (scheduled and first and last):
        return queue_s, None, None
    return queue_s, max(0.0, first - scheduled), max(0.0, last - first)


def _speculated(completion: Any, on: bool) -> tuple[int | None, int | None, int | None]:
    """(drafted, accepted, verify steps) of one request from vLLM's per-request summary:
    ``histogram[j]`` counts the steps that accepted j draft tokens. Zeros where the
    engine speculates but never drafted for the request; ``None`` where it does not."""
    if not on:
        return None, None, None
    metrics = getattr(completion, "spec_decode_metrics", None)
    if metrics is None:
        return 0, 0, 0
    histogram = list(metrics.histogram)
    accepted = sum(j * n for j, n in enumerate(histogram))
    return int(metrics.num_draft_tokens), accepted, sum(histogram)


class VLLMEngine(Engine):
    """Steps as vLLM requests: token-id prompts, per-request priority, prefix cache."""

    name = "vllm"

    def __init__(self, config: VLLMConfig) -> None:
        self.config = config
        self.model = config.model
        self.tp = config.tp
        self.max_model_len = config.max_model_len or 0  # the model's own once it loads
        self.vocab_size = 0  # read from the model when it loads
        self._llm: Any = None
        self._tokenizer: Any = None
        self._layout: CheckpointLayout | None = None  # what in-place loads must match
        self._ids = itertools.count()
        self._in_flight: dict[str, str] = {}  # request id -> trajectory id
        self._aborted: set[str] = set()
        self._reset_task: asyncio.Task[None] | None = None  # a prefix-cache reset after keep
        self._fused: dict[str, list[str]] | None = None  # the model's fused modules, once asked
        self._failed: str | None = None
        self.generated_tokens = 0
        # Latest scheduler figures vLLM reported (running, waiting, KV usage).
        self._scheduler: dict[str, float] = dict.fromkeys(
            ("running", "waiting", "kv_usage", "drafted", "accepted", "drafts"), 0
        )

    @property
    def ready(self) -> bool:
        return self._llm is not None and self._failed is None and not self._llm.errored

    async def start(self) -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.config.kv_cache_gib))
        os.environ.update(vllm_cpu_env(range(self.config.tp), os.environ))
        from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415 - optional extra
        from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415

        args = AsyncEngineArgs(**engine_kwargs(self.config, cpu_build=is_cpu_build()))
        try:
            self._llm = AsyncLLM.from_engine_args(args, stat_loggers=[self._stat_logger_factory()])
        except Exception as exc:  # vLLM raises pydantic/ValueError; map the one users hit
            too_long = _MAX_LEN_REFUSED.search(str(exc))
            if too_long is None:
                raise
            raise ConfigError(
                f"max_model_len {too_long['asked']} is more than {self.model}'s own context "
                f"of {int(float(too_long['own']))} tokens: leave it out (--max-model-len, the "
                "pool's vllm.maxModelLen) to use the model's own, or give a smaller value"
            ) from None
        self.speculation, why = engine_speculation(self.config, cpu_build=is_cpu_build())
        if self.config.speculation.on:
            logging.getLogger("heddle.worker").info("%s", why)  # auto: its K table
        if self.speculation.on:
            await self._refuse_faulty_speculation()
        if self.speculation.k_measured:
            await self._measure_k()
        self.max_model_len = int(self._llm.model_config.max_model_len)
        self._tokenizer = self._llm.tokenizer
        self._tool_parsers = VLLMToolParsers(self._tokenizer, self.model)
        # vLLM's own bound (renderers' validate_token_ids): the tokenizer's ids and the
        # model's embedding rows may differ (Qwen3 pads its vocabulary); either is valid.
        self.vocab_size = max(
            int(self._tokenizer.max_token_id) + 1, int(self._llm.model_config.get_vocab_size())
        )
        self.weights = LoadedWeights(self.config.model, None)
        if os.path.isdir(self.config.model):  # an HF id: only the architecture can be checked
            self._layout = await asyncio.to_thread(checkpoint_layout, self.config.model)

    async def _refuse_faulty_speculation(self) -> None:
        """Every rank's fault checks (heddle.worker._vllm_patches): a fault found and not
        fixed stops the engine with the reason; corrupted samples are never served."""
        from ._vllm_patches import speculation_faults  # noqa: PLC0415

        results = await self._llm.collective_rpc("heddle_speculation_faults")
        why = speculation_faults(
            list(results), batch_size_table=bool(self.speculation.by_batch_size)
        )
        if why is not None:
            self._llm.shutdown()
            self._llm = None
            raise ConfigError(why)

    async def _measure_k(self) -> None:
        """Every rank caps its proposer's K by a table rebuilt from the acceptance it
        measures (``auto`` with suffix decoding; heddle.worker._vllm_patches.measure_k)."""
        settings = {
            "method": self.speculation.method,
            "model": self.config.model,
            "tp": self.config.tp,
            "max_num_seqs": engine_max_num_seqs(self.config),
            "max_model_len": self.config.max_model_len,
            "cpu_build": is_cpu_build(),
            "max_k": self.speculation.num_speculative_tokens,
        }
        done = await self._llm.collective_rpc("heddle_measure_k", args=(settings,))
        if not all(done):
            self._llm.shutdown()
            self._llm = None
            raise ConfigError(
                "speculation auto: this vLLM's suffix proposer cannot be capped per step (it "
                "is missing, changed shape, or cannot draft fewer than its K); give "
                "--speculative-tokens-by-batch-size (or a fixed K) instead"
            )

    async def k_table(self) -> dict[str, Any] | None:
        if not self.ready or not self.speculation.k_measured:
            return None
        try:  # between engine steps; a wedged or busy engine core must not hang /v1/state
            states = await asyncio.wait_for(
                self._llm.collective_rpc("heddle_k_state"), K_STATE_TIMEOUT_S
            )
        except TimeoutError:
            return None
        return dict(states[0]) if states and states[0] is not None else None

    async def seed_drafts(self, key: str, token_ids: list[int]) -> bool:
        """Insert a text into every rank's suffix cache (``collective_rpc``)."""
        if not self.ready or self.speculation.method != "suffix":
            return False
        done = await self._llm.collective_rpc("heddle_seed_drafts", args=(key, token_ids))
        return all(bool(d) for d in done)

    async def load_weights(self, path: str, version: str, *, keep: bool = False) -> LoadedWeights:
        """vLLM's in-place reload on every TP rank: ``collective_rpc("reload_weights")``.

        Each rank's model runner streams the checkpoint's safetensors into the live
        parameters (``vllm.model_executor.model_loader.reload``); the KV cache stays
        allocated. Cached prefixes were computed with the old weights, so the prefix
        cache is reset afterwards. ``keep``: ``AsyncLLM.pause_generation(mode="keep",
        clear_cache=False)`` freezes the running requests with their KV, the reload
        runs, ``resume_generation`` lets them go on (under the new weights from the
        next token; the session records the version per segment). vLLM resets the
        prefix cache only when no running request holds blocks, so with requests
        kept the reset is retried until it succeeds (:meth:`_reset_prefix_cache`).
        """
        if not self.ready:
            raise EngineError(self._failed or "the vLLM engine is not running")
        layout = await asyncio.to_thread(checkpoint_layout, path)
        running = self._layout or CheckpointLayout(
            self.config.model, tuple(self._llm.model_config.architectures or ()), layout.shapes
        )
        check_compatible(layout, running)
        started = time.monotonic()
        if keep:
            await self._llm.pause_generation(mode="keep", clear_cache=False)
        try:
            await self._llm.collective_rpc(
                "reload_weights", kwargs={"weights_path": path, "is_checkpoint_format": True}
            )
        except Exception as exc:
            # A partial reload leaves layers half-written: nothing safe to serve from.
            self._failed = f"loading weights from {path} broke the vLLM engine: {exc}"
            raise EngineError(self._failed) from exc
        finally:
            if keep:
                await self._llm.resume_generation()
        self.weights = LoadedWeights(path, version, time.monotonic() - started)
        await self._after_load(version, keep=keep)
        return self.weights

    async def _after_load(self, version: str, *, keep: bool) -> None:
        """Cached prefixes were computed with the old weights: drop them (retried while
        kept requests hold blocks)."""
        if not await self._llm.reset_prefix_cache() and keep:
            self._reset_task = asyncio.create_task(self._reset_prefix_cache(version))

    def push_layout(self) -> CheckpointLayout | None:
        if self._layout is None:
            raise CheckpointError(
                f"this worker started from {self.model}, not a checkpoint directory, so it "
                "cannot check pushed tensors' names and shapes; start it from a directory"
            )
        return self._layout

    async def fused_modules(self) -> Mapping[str, Sequence[str]]:
        if self._fused is None:
            found = await self._llm.collective_rpc("heddle_packed_modules")
            self._fused = dict(found[0]) if found else {}
        return self._fused

    async def receive_weights(self, spec: Mapping[str, Any], *, delta: bool) -> LoadedWeights:
        """Weights over the trainer's group into every TP rank (:mod:`._weights_receiver`
        in each vLLM worker, through ``collective_rpc``), then vLLM's in-place reload from
        them with the engine paused, requests kept (``pause_generation(mode="keep")``)."""
        if not self.ready:
            raise EngineError(self._failed or "the vLLM engine is not running")
        await self._llm.collective_rpc("heddle_push_begin", args=(dict(spec), delta))
        want = "received" if delta else "joined"
        while True:  # joining (and, for a delta, receiving) runs beside generation
            statuses = await self._llm.collective_rpc("heddle_push_status")
            failed = [s["error"] for s in statuses if s["phase"] == "failed"]
            if failed:
                await self._llm.collective_rpc("heddle_push_drop")
                raise CheckpointError(str(failed[0]))
            if all(s["phase"] == want for s in statuses):
                break
            await asyncio.sleep(0.02)
        kept = len(self._in_flight)
        started = time.monotonic()
        await self._llm.pause_generation(mode="keep", clear_cache=False)
        try:
            statuses = await self._llm.collective_rpc("heddle_push_apply")
        except Exception as exc:
            # Part of the update is in the weights: nothing safe to serve from.
            self._failed = f"loading pushed weights (version {spec['version']}) broke: {exc}"
            raise EngineError(self._failed) from exc
        finally:
            await self._llm.resume_generation()
        stall_s = time.monotonic() - started
        self.last_push = {
            "received_bytes": sum(int(s["received_bytes"]) for s in statuses) // len(statuses),
            "receive_s": max(float(s["receive_s"]) for s in statuses),
            "kept": kept,
        }
        where = f"push://{spec['address']}:{spec['port']}"
        self.weights = LoadedWeights(where, str(spec["version"]), stall_s)
        await self._after_load(str(spec["version"]), keep=True)
        return self.weights

    async def _reset_prefix_cache(self, version: str) -> None:
        """Drop the old version's cached prefixes once no kept request holds blocks."""
        while self._llm is not None and self.weights is not None:
            if self.weights.version != version:  # a newer load resets (or retries) itself
                return
            if await self._llm.reset_prefix_cache():
                return
            await asyncio.sleep(0.05)

    def _stat_logger_factory(self) -> Any:
        """A vLLM stat logger that copies the scheduler's figures into this engine."""
        from vllm.v1.metrics.loggers import StatLoggerBase  # noqa: PLC0415

        figures = self._scheduler

        class _Capture(StatLoggerBase):  # type: ignore[misc]
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(
                self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kwargs: Any
            ) -> None:
                if scheduler_stats is not None:
                    figures["running"] = scheduler_stats.num_running_reqs
                    figures["waiting"] = scheduler_stats.num_waiting_reqs
                    figures["kv_usage"] = scheduler_stats.kv_cache_usage
                    spec = getattr(scheduler_stats, "spec_decoding_stats", None)
                    if spec is not None:
                        figures["drafted"] += spec.num_draft_tokens
                        figures["accepted"] += spec.num_accepted_tokens
                        figures["drafts"] += spec.num_drafts

            def log_engine_initialized(self) -> None:
                pass

        return _Capture

    async def shutdown(self) -> None:
        if self._llm is not None:
            await self.abort_all()
            self._llm.shutdown()
            self._llm = None

    async def abort_all(self) -> None:
        if self._llm is not None and self._in_flight:
            ids = list(self._in_flight)
            self._aborted.update(ids)
            await self._llm.abort(ids)

    async def step(
        self, trajectory_id: str, context: list[int], sampling: Sampling, priority: int
    ) -> StepOutput:
        if not self.ready:
            raise EngineError(self._failed or "the vLLM engine is not running")
        from vllm import SamplingParams  # noqa: PLC0415
        from vllm.exceptions import VLLMClientError  # noqa: PLC0415
        from vllm.inputs import TokensPrompt  # noqa: PLC0415
        from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415

        try:
            params = SamplingParams(
                # Only the final output, no text: vLLM's API process would otherwise
                # detokenize every token and wake this step once per token, beside its
                # engine on the same cores; the worker decodes the text once at the end.
                output_kind=RequestOutputKind.FINAL_ONLY,
                detokenize=False,
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                seed=sampling.seed,
                ignore_eos=sampling.ignore_eos,
                logprobs=1 if sampling.logprobs else None,
                stop_token_ids=list(sampling.stop_token_ids) or None,
            )
        except (VLLMClientError, ValueError) as exc:
            raise EngineInputError(f"vLLM refused the sampling parameters: {exc}") from exc
        request_id = f"{trajectory_id}#{next(self._ids)}"
        self._in_flight[request_id] = trajectory_id
        started = time.monotonic()
        final: Any = None
        try:
            async for output in self._llm.generate(
                TokensPrompt(prompt_token_ids=context), params, request_id, priority=priority
            ):
                final = output  # FINAL_ONLY: the one output, when the request finishes
        except asyncio.CancelledError:
            await self._llm.abort(request_id)
            raise
        except (VLLMClientError, ValueError) as exc:
            if not self._llm.errored:  # the request's fault, not the engine's: a 4xx
                raise EngineInputError(f"vLLM refused this step: {exc}") from exc
            self._failed = f"vLLM engine died: {exc}"
            raise EngineError(f"vLLM failed this step: {exc}") from exc
        except Exception as exc:
            if self._llm is not None and self._llm.errored:
                self._failed = f"vLLM engine died: {exc}"
            raise EngineError(f"vLLM failed this step: {exc}") from exc
        finally:
            self._in_flight.pop(request_id, None)
        aborted = request_id in self._aborted
        self._aborted.discard(request_id)
        if final is None or not final.outputs:
            return StepOutput([], "abort", len(context), 0)
        completion = final.outputs[0]
        tokens = list(completion.token_ids)
        self.generated_tokens += len(tokens)
        logprobs = None
        if sampling.logprobs and completion.logprobs:
            logprobs = [
                step[tid].logprob for tid, step in zip(tokens, completion.logprobs, strict=False)
            ]
        done = time.monotonic()
        queue_s, prefill_s, decode_s = _engine_core_times(final.metrics)
        if prefill_s is None or decode_s is None:  # no stats from vLLM: the worker's clock
            prefill_s, decode_s = 0.0, max(0.0, done - started - queue_s)
        drafted, accepted, draft_steps = _speculated(completion, self.speculation.on)
        return StepOutput(
            token_ids=tokens,
            finish_reason="abort" if aborted else (completion.finish_reason or "stop"),
            prompt_tokens=len(context),
            cached_tokens=int(final.num_cached_tokens or 0),
            logprobs=logprobs,
            queue_s=queue_s,
            prefill_s=prefill_s,
            decode_s=decode_s,
            drafted_tokens=drafted,
            accepted_tokens=accepted,
            draft_steps=draft_steps,
        )

    async def warm(self, trajectory_id: str, context: list[int]) -> None:
        """Prefill by generating one throw-away token: the context lands in the prefix cache.

        The token needs room under the max length, so a context that fills it is
        prefilled without its last token (the cache holds whole blocks anyway).
        """
        prefix = context[: self.max_model_len - 1]
        if prefix:
            await self.step(trajectory_id, prefix, Sampling(max_tokens=1, temperature=0.0), 0)

    def release(self, trajectory_id: str) -> None:
        """vLLM evicts cached blocks by LRU on its own; nothing to free explicitly."""

    def stats(self) -> EngineStats:
        # vLLM reports after each engine step; between steps the in-flight count is fresher.
        idle = not self._in_flight
        return EngineStats(
            running=0 if idle else int(self._scheduler["running"]),
            waiting=0 if idle else int(self._scheduler["waiting"]),
            kv_usage=float(self._scheduler["kv_usage"]),
            generated_tokens=self.generated_tokens,
            drafted_tokens=int(self._scheduler["drafted"]),
            accepted_tokens=int(self._scheduler["accepted"]),
            draft_steps=int(self._scheduler["drafts"]),
        )

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tokenizer.decode(token_ids))

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        return str(
            self._tokenizer.apply_chat_template(
                messages,
                tools=list(tools) if tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        )

    def parse_tool_calls(
        self, text: str, parser: str, tools: Sequence[Mapping[str, Any]] | None
    ) -> ParsedTurn | None:
        return self._tool_parsers.parse(text, parser, tools)
