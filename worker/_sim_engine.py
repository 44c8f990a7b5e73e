"""A simulated engine: the simulator's performance model, in real (scaled) time.

It batches steps continuously like vLLM (priority order, batch cap, KV
capacity, prefix cache) and sleeps for as long as the performance model says
each batch segment takes, times ``time_scale``. Tokens are synthetic: lower-case
letters and spaces, so the text is readable and round-trips through the byte
tokenizer. A step always generates ``max_tokens`` tokens (``finish_reason``
"length"), which is how the synthetic environment scripts turn lengths.
With ``scripted_replies`` a prompt may carry the model's answers itself:
``<reply>...</reply>`` blocks in the context, the k-th answering the k-th
assistant turn (finish reason "stop"); this is how tool-call loops are tested
without a trained model. For scale tests and benchmarks without a model; never a stand-in for vLLM's
outputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import os
import random
import re
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from heddle.exceptions import CheckpointError
from heddle.scheduler import PerfModel

from ._engine import Engine, EngineError, EngineStats, Sampling, StepOutput
from ._weights import CheckpointLayout, LoadedWeights, checkpoint_dir, checkpoint_layout
from ._weights_receiver import Receiver

__all__ = ["SIM_MAX_MODEL_LEN", "SimulatedEngine"]

SIM_MAX_MODEL_LEN = 65_536  # the simulated engine's context when none is given

_ALPHABET = [32, *range(97, 123)]  # space and a-z as byte-token ids
_REPLY = re.compile(r"<reply>(.*?)</reply>", re.DOTALL)
_ASSISTANT_TURN = "<|assistant|>\n"


class _IdleCache:
    """Contexts kept for the prefix cache, least recent first, with their token total."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, int] = OrderedDict()
        self.total = 0

    def get(self, key: str, default: int = 0) -> int:
        return self._items.get(key, default)

    def put(self, key: str, tokens: int) -> None:
        self.total += tokens - self._items.get(key, 0)
        self._items[key] = tokens
        self._items.move_to_end(key)

    def pop(self, key: str) -> int:
        tokens = self._items.pop(key, 0)
        self.total -= tokens
        return tokens

    def keys(self) -> list[str]:
        return list(self._items)

    def oldest_except(self, key: str) -> str | None:
        for k in self._items:
            if k != key:
                return k
        return None


@dataclass(eq=False)
class _Request:
    trajectory_id: str
    context: int
    remaining: int
    sampling: Sampling
    future: asyncio.Future[StepOutput]
    enqueued: float
    cached: int = 0
    admitted: float = 0.0
    prefill_s: float = 0.0
    tokens: list[int] = field(default_factory=list)
    script: list[int] | None = None  # scripted reply tokens, if any


class SimulatedEngine(Engine):
    """Continuous batching on the performance model; see the module docstring."""

    name = "sim"
    vocab_size = 256  # the tokenizer's tokens are bytes

    def __init__(
        self,
        perf: PerfModel,
        *,
        tp: int = 1,
        model: str = "sim",
        max_model_len: int | None = None,
        time_scale: float = 1.0,
        load_s: float = 0.0,
        seed: int = 0,
        scripted_replies: bool = False,
    ) -> None:
        if time_scale < 0:
            raise ValueError(f"time_scale={time_scale} must be >= 0")
        self.perf = perf
        self.tp = tp
        self.model = model
        self.max_model_len = max_model_len or SIM_MAX_MODEL_LEN
        self.time_scale = time_scale
        self.load_s = load_s
        self.scripted_replies = scripted_replies
        self.instance = perf.instance(f"sim-tp{tp}", tp)
        self._rng = random.Random(seed)
        self._waiting: list[tuple[int, int, _Request]] = []
        self._seq = itertools.count()
        self._running: list[_Request] = []
        self._cache = _IdleCache()  # trajectory -> cached tokens
        self._pending_prefill = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ready = False
        self._failed: BaseException | None = None
        self.generated_tokens = 0

    # -- lifecycle ------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready and self._failed is None

    async def start(self) -> None:
        if self.load_s:
            await asyncio.sleep(self.load_s)
        self._task = asyncio.create_task(self._loop(), name="sim-engine")
        self.weights = LoadedWeights(self.model, None)
        self._ready = True

    async def load_weights(self, path: str, version: str, *, keep: bool = False) -> LoadedWeights:
        """Records the version only: the sim has no weights, so its tokens do not change.

        The path must be a directory (as a real worker needs), so a job naming a
        missing checkpoint fails on sim workers as it would on vLLM ones. The
        prefix cache is dropped, as a real load does (``keep``: all but the contexts
        of the steps it keeps running, as vLLM can only drop unheld blocks).
        """
        checkpoint_dir(path)
        held = {r.trajectory_id for r in self._running} if keep else set()
        for key in list(self._cache.keys()):
            if key not in held:
                self._cache.pop(key)
        self.weights = LoadedWeights(path, version)
        return self.weights

    def push_layout(self) -> CheckpointLayout | None:
        """The checkpoint the sim was started on, when it is one (header only): pushed
        tensors must then match it as on vLLM; else any tensors are taken."""
        if os.path.isdir(self.model):
            return checkpoint_layout(self.model)
        return None

    async def receive_weights(self, spec: Mapping[str, Any], *, delta: bool) -> LoadedWeights:
        """Receives the tensors over the trainer's group for real (gloo) and drops them:
        the sim has no weights, so its tokens do not change; the version and the prefix
        cache change as on vLLM (the cache of the running steps is kept)."""
        receiver = Receiver(spec, int(spec["rank"]), stage=True)
        receiver.start()
        while receiver.phase not in ("received", "failed"):
            await asyncio.sleep(0.01)
        receiver.close()
        if receiver.error is not None:
            raise CheckpointError(receiver.error)
        started = time.monotonic()
        held = {r.trajectory_id for r in self._running}
        for key in list(self._cache.keys()):
            if key not in held:
                self._cache.pop(key)
        self.last_push = {
            "received_bytes": receiver.received_bytes,
            "receive_s": receiver.receive_s,
            "kept": len(held),
        }
        version = str(spec["version"])
        where = f"push://{spec['address']}:{spec['port']}"
        self.weights = LoadedWeights(where, version, time.monotonic() - started)
        return self.weights

    async def shutdown(self) -> None:
        self._ready = False
        await self.abort_all()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def abort_all(self) -> None:
        for req in [*self._running, *(r for _, _, r in self._waiting)]:
            if not req.future.done():
                req.future.set_result(self._output(req, "abort"))
        self._running.clear()
        self._waiting.clear()

    # -- requests ---------------------------------------------------------------------
    async def step(
        self, trajectory_id: str, context: list[int], sampling: Sampling, priority: int
    ) -> StepOutput:
        if self._failed is not None:
            raise EngineError(f"the simulated engine failed: {self._failed}")
        overhead_s = self.perf.step_overhead_s * self.time_scale
        if overhead_s > 0:
            # A profiled engine's step spends this outside the engine core on the real
            # worker (HTTP, vLLM's API process); the simulator charges it too (ARRIVE).
            await asyncio.sleep(overhead_s)
        loop = asyncio.get_running_loop()
        req = _Request(
            trajectory_id,
            len(context),
            sampling.max_tokens,
            sampling,
            loop.create_future(),
            time.monotonic(),
        )
        if self.scripted_replies:
            req.script = self._scripted(context)
            if req.script is not None:  # cut at max_tokens: then it ends "length", as vLLM's
                req.remaining = max(1, min(len(req.script), sampling.max_tokens))
        heapq.heappush(self._waiting, (priority, next(self._seq), req))
        self._wake.set()
        try:
            return await req.future
        except asyncio.CancelledError:
            self._drop(req)
            raise

    def _drop(self, req: _Request) -> None:
        """A cancelled step leaves the batch (or the queue) at once, as vLLM's abort does."""
        if req in self._running:
            self._running.remove(req)
        else:
            self._waiting = [w for w in self._waiting if w[2] is not req]
            heapq.heapify(self._waiting)
        self._wake.set()

    def _scripted(self, context: list[int]) -> list[int] | None:
        text = self.decode(context)
        replies = _REPLY.findall(text)
        turn = text.count(_ASSISTANT_TURN) - 1
        if not 0 <= turn < len(replies):
            return None
        return self.encode(replies[turn])

    async def warm(self, trajectory_id: str, context: list[int]) -> None:
        cached = self._cache.get(trajectory_id, 0)
        if len(context) > cached:
            self._pending_prefill += len(context) - cached
            self._cache.put(trajectory_id, len(context))
            self._wake.set()

    def release(self, trajectory_id: str) -> None:
        self._cache.pop(trajectory_id)

    def stats(self) -> EngineStats:
        used = sum(r.context + len(r.tokens) for r in self._running) + self._cache.total
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            kv_usage=min(1.0, used / max(1, self.instance.kv_capacity_tokens)),
            generated_tokens=self.generated_tokens,
        )

    # -- tokenizer: bytes are tokens ----------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        # No template knows the tools here: the session's own parser reads tool calls.
        text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
        return text + ("<|assistant|>\n" if add_generation_prompt else "")

    # -- the batching loop -----------------------------------------------------------------
    def _output(self, req: _Request, reason: str) -> StepOutput:
        now = time.monotonic()
        logprobs = (
            [math.log(1 / len(_ALPHABET))] * len(req.tokens) if req.sampling.logprobs else None
        )
        queue_s = (req.admitted or now) - req.enqueued
        return StepOutput(
            token_ids=list(req.tokens),
            finish_reason=reason,
            prompt_tokens=req.context,
            cached_tokens=req.cached,
            logprobs=logprobs,
            queue_s=queue_s,
            prefill_s=req.prefill_s,
            decode_s=max(0.0, now - (req.admitted or now) - req.prefill_s),
        )

    def _admit(self) -> int:
        cap = self.perf.batch_cap
        capacity = self.instance.kv_capacity_tokens
        prefill = 0
        used = sum(r.context + len(r.tokens) for r in self._running)
        while self._waiting and len(self._running) < cap:
            _, _, req = self._waiting[0]
            own = min(self._cache.get(req.trajectory_id), req.context)
            idle = self._cache.total - self._cache.get(req.trajectory_id)
            while used + idle + req.context > capacity and idle > 0:
                victim = self._cache.oldest_except(req.trajectory_id)
                if victim is None:
                    break
                idle -= self._cache.pop(victim)
            if used + idle + req.context > capacity and self._running:
                break  # wait for room
            heapq.heappop(self._waiting)
            self._cache.pop(req.trajectory_id)
            req.cached = own
            req.admitted = time.monotonic()
            prefill += req.context - own
            used += req.context
            self._running.append(req)
        return prefill

    def _credit(self, iterations: int) -> None:
        for req in self._running:
            if req.script is not None:
                end = len(req.tokens) + min(iterations, req.remaining)
                req.tokens.extend(req.script[len(req.tokens) : end])
            else:
                req.tokens.extend(self._rng.choices(_ALPHABET, k=iterations))
            req.remaining -= iterations
        self.generated_tokens += iterations * len(self._running)
        still: list[_Request] = []
        for req in self._running:
            if req.remaining > 0:
                still.append(req)
                continue
            self._cache.put(req.trajectory_id, req.context + len(req.tokens))
            if not req.future.done():
                finished = req.script is not None and len(req.tokens) == len(req.script)
                req.future.set_result(self._output(req, "stop" if finished else "length"))
        self._running = still

    async def _loop(self) -> None:
        try:
            while True:
                # Cleared before admitting: an arrival from here on interrupts the segment.
                self._wake.clear()
                prefill_tokens = self._admit() + self._pending_prefill
                self._pending_prefill = 0
                if not self._running and not prefill_tokens:
                    await self._wake.wait()
                    continue
                prefill_s = self.perf.prefill_time(prefill_tokens, self.tp)
                for req in self._running:
                    if req.prefill_s == 0.0 and req.admitted:
                        req.prefill_s = prefill_s * self.time_scale
                await asyncio.sleep(prefill_s * self.time_scale)
                if not self._running:
                    continue
                batch = len(self._running)
                context = sum(r.context + len(r.tokens) for r in self._running)
                k = min(r.remaining for r in self._running)
                duration = self.perf.segment_time(batch, context, self.tp, k) * self.time_scale
                started = time.monotonic()
                interrupted = False
                if batch < self.perf.batch_cap and duration > 0:
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=duration)
                        interrupted = True
                    except TimeoutError:
                        pass
                elif duration > 0:
                    await asyncio.sleep(duration)
                done = k
                if interrupted and self.time_scale > 0:
                    # Newcomers join at the next iteration boundary: finish the current one.
                    elapsed = (time.monotonic() - started) / self.time_scale
                    within = self.perf.iterations_within(batch, context, self.tp, elapsed)
                    done = min(k, within + 1)
                    boundary = self.perf.segment_time(batch, context, self.tp, done)
                    rest = (boundary - elapsed) * self.time_scale
                    if rest > 0:
                        await asyncio.sleep(rest)
                self._credit(done)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must surface as 503, not a hang
            self._failed = exc
            for req in [*self._running, *(r for _, _, r in self._waiting)]:
                if not req.future.done():
                    req.future.set_exception(EngineError(f"simulated engine failed: {exc}"))
