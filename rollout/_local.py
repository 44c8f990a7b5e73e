"""Local mode's pool: one ``heddle worker`` process per engine instance of a shape.

Workers listen on free loopback ports, log to files, and run in their own
process group so the pool, not the terminal, decides when they stop:
:meth:`LocalPool.stop` sends SIGTERM (the worker drains) and SIGKILL after a
grace period. vLLM's CPU build gets one core per TP rank, dealt round-robin
over the machine's cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from heddle.exceptions import AddressInUseError, ConfigError, HeddleError
from heddle.worker import (
    DEFAULT_WORKER_ARGS,
    NAMED_MODELS,
    NO_SPECULATION,
    THREADS_BIND,
    TINY,
    TINY_DIR,
    TOKEN_ENV,
    Speculation,
    WorkerArgs,
    WorkerEndpoint,
    auto_speculation,
    is_cpu_build,
    named_model_dir,
    vllm_cpu_env,
)

from ._job import LocalJob

__all__ = [
    "TINY",
    "TINY_DIR",
    "LocalPool",
    "LocalWorkerOptions",
    "die_with_parent",
    "is_tiny_model",
    "local_model_dir",
    "local_speculation",
    "worker_options",
]

# A traceback's last line: ``module.SomeError: message``.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b(: |$)")


@dataclass(frozen=True)
class LocalWorkerOptions:
    """How local workers run; times in seconds."""

    engine: str = "vllm"  # 'vllm' (the CPU build) or 'sim' (the performance model)
    model: str | None = None  # a model directory for vllm
    max_model_len: int | None = None  # None: the model's own (vllm), the sim engine's (sim)
    kv_cache_gib: int = 1  # vLLM CPU KV cache per worker, whole GiB
    block_size: int = 32  # vLLM CPU needs a multiple of 32
    max_num_seqs: int = 64
    time_scale: float = 1.0  # sim: multiplies the performance model's times
    scripted_replies: bool = False  # sim: answer with <reply> blocks of the prompt (tests)
    cluster: str | None = None  # sim: the cluster file (its performance model) to run on
    host: str = "127.0.0.1"
    startup_timeout_s: float = 300.0
    grace_s: float = 5.0
    log_dir: Path = Path(".heddle/logs")
    weights_roots: tuple[str, ...] = ()  # where POST /v1/weights may load (the job's folder)
    speculation: Speculation = NO_SPECULATION  # vllm: the pool's spec.speculation


def local_speculation(options: LocalWorkerOptions) -> Speculation:
    """What local workers will draft with, for the start-up decisions and the drafts
    feed: the pool's speculation, except ``auto`` where a vLLM worker here starts off
    (vLLM's CPU build: heddle.worker.CPU_BUILD_OFF), which the decisions must not
    simulate as drafting."""
    speculation = options.speculation
    if options.engine != "vllm" or speculation.method != "auto":
        return speculation
    resolved, _ = auto_speculation(
        speculation,
        model=options.model or "",
        tp=1,
        max_num_seqs=options.max_num_seqs,
        max_model_len=options.max_model_len,
        cpu_build=is_cpu_build(),
    )
    # On: keep auto (each worker builds its own table at its TP, as the simulator does).
    return speculation if resolved.on else resolved


def die_with_parent() -> None:
    """Linux: the worker gets SIGTERM when the process that started it dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        import ctypes  # noqa: PLC0415

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


# A worker holds its port from its first second (heddle.worker.listen_socket), but the
# port is picked here and freed before the worker starts: another process on the host can
# take it in between. The worker then exits at once with AddressInUseError's code, and
# the pool starts it again on a fresh port, up to this many times in all.
PORT_TRIES = 3


def _times(tries: int) -> str:
    return "once" if tries == 1 else f"{tries} times in a row"


def _popen(command: list[str], log: IO[bytes], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """One worker process, in its own session, that dies with this one."""
    return subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509 - no threads fork-unsafe here
    )


@dataclass
class _Proc:
    endpoint: WorkerEndpoint
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    command: list[str]
    env: dict[str, str]


class LocalPool:
    """Starts, watches and stops local workers for a list of TP degrees."""

    def __init__(self, tps: list[int], options: LocalWorkerOptions) -> None:
        if options.engine == "vllm" and not options.model:
            raise HeddleError("a local vLLM pool needs a model directory")
        self.tps = tps
        self.options = options
        self.procs: dict[str, _Proc] = {}
        # One token per run: other users of the host cannot drive these workers. It goes in
        # the environment, which only this user can read (/proc/PID/environ), never in argv.
        self.token = secrets.token_urlsafe(32)

    def _command(self, tp: int, port: int) -> list[str]:
        o = self.options
        vllm = o.engine == "vllm"
        args = WorkerArgs(
            engine="vllm" if vllm else "sim",
            tp=tp,
            host=o.host,
            port=port,
            max_model_len=o.max_model_len,
            grace_s=o.grace_s,
            model=str(o.model) if vllm else None,
            block_size=o.block_size if vllm else None,
            kv_cache_gib=o.kv_cache_gib,
            max_num_seqs=o.max_num_seqs,
            time_scale=o.time_scale,
            cluster=o.cluster or DEFAULT_WORKER_ARGS.cluster,
            scripted_replies=o.scripted_replies and not vllm,
            weights_roots=o.weights_roots,
            **(WorkerArgs.speculation_flags(o.speculation) if vllm else {}),
        )
        return [sys.executable, "-m", "heddle", *args.argv()]

    def _pick_port(self) -> int:
        """A port free now; the worker binds it when it starts (see PORT_TRIES)."""
        return free_port(self.options.host)

    def _spawn(self, name: str, tp: int, cores: list[int]) -> _Proc:
        """Start one worker on a free port (its cores in ``cores``)."""
        o = self.options
        port = self._pick_port()
        # The pool deals the cores: a binding in its own environment must not apply to all.
        inherited = {k: v for k, v in os.environ.items() if k != THREADS_BIND}
        env = vllm_cpu_env(cores, inherited)
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the log files stay readable
        env[TOKEN_ENV] = self.token
        o.log_dir.mkdir(parents=True, exist_ok=True)
        log = (o.log_dir / f"{name}.log").open("ab")
        command = self._command(tp, port)
        endpoint = WorkerEndpoint(name, f"http://{o.host}:{port}", tp, self.token)
        return _Proc(endpoint, _popen(command, log, env), log, command, env)

    async def start(self) -> list[WorkerEndpoint]:
        """Start every worker and wait until all are ready (or fail with their log's tail)."""
        cores = os.cpu_count() or 1
        next_core = 0
        cores_of: dict[str, tuple[int, list[int]]] = {}
        for i, tp in enumerate(self.tps):
            name = f"worker-{i}-tp{tp}"
            assigned = [(next_core + j) % cores for j in range(tp)]
            next_core += tp
            self.procs[name] = self._spawn(name, tp, assigned)
            cores_of[name] = (tp, assigned)
        await asyncio.gather(*(self._ready(name, *cores_of[name]) for name in self.procs))
        return [p.endpoint for p in self.procs.values()]

    async def _ready(self, name: str, tp: int, cores: list[int]) -> None:
        """Until ``name`` is ready; started again on another port if its was taken."""
        for attempt in range(1, PORT_TRIES + 1):
            try:
                await self._wait_ready(self.procs[name])
                return
            except AddressInUseError:
                if attempt == PORT_TRIES:
                    raise
                self.procs[name].log.close()
                self.procs[name] = self._spawn(name, tp, cores)

    async def _wait_ready(self, proc: _Proc, tries: int = PORT_TRIES) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        async with httpx.AsyncClient() as http:
            while time.monotonic() < deadline:
                if proc.process.poll() is not None:
                    if proc.process.returncode == AddressInUseError.exit_code:
                        raise AddressInUseError(
                            f"local worker {proc.endpoint.name} found its port taken "
                            f"{_times(tries)}: {self.cause(proc)} "
                            f"(its log: {self.log_path(proc)})"
                        )
                    raise HeddleError(
                        f"local worker {proc.endpoint.name} exited with code "
                        f"{proc.process.returncode} while starting: {self.cause(proc)} "
                        f"(its log: {self.log_path(proc)}; `heddle doctor` checks the setup)"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    reply = await http.get(proc.endpoint.url + "/readyz", timeout=2.0)
                    if reply.status_code == 200:
                        return
                await asyncio.sleep(0.25)
        raise HeddleError(
            f"local worker {proc.endpoint.name} was not ready after "
            f"{self.options.startup_timeout_s:.0f} s; its log: {self.log_path(proc)}"
        )

    def log_path(self, proc: _Proc) -> Path:
        return self.options.log_dir / f"{proc.endpoint.name}.log"

    def cause(self, proc: _Proc) -> str:
        """The last exception a worker's log names, with its first detail line."""
        try:
            text = self.log_path(proc).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "no log"
        lines = text.splitlines()
        for i in range(len(lines) - 1, -1, -1):
            if _EXCEPTION_LINE.match(lines[i]):
                detail = lines[i + 1].strip() if i + 1 < len(lines) else ""
                found = lines[i].strip()
                if detail and lines[i + 1][:1].isspace():  # pydantic & co. explain below
                    found += f" ({detail.split(' [type=')[0]})"
                return found[:400]
        tail = [line.strip() for line in lines if line.strip()]
        return tail[-1][:400] if tail else "the log is empty"

    def kill(self, name: str) -> None:
        """SIGKILL one worker and its engine processes (tests: a worker dying mid-run)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.procs[name].process.pid, signal.SIGKILL)

    async def restart(self, name: str) -> None:
        """Start a worker again on the same address (after :meth:`kill`)."""
        old = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            old.process.wait(timeout=10)
        process = _popen(old.command, old.log, old.env)
        self.procs[name] = _Proc(old.endpoint, process, old.log, old.command, old.env)
        # The same address, so no retry on another port: the session knows this one.
        await self._wait_ready(self.procs[name], tries=1)

    async def stop(self) -> None:
        """SIGTERM every worker, SIGKILL what is left after the grace period."""
        for proc in self.procs.values():
            if proc.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.options.grace_s + 5.0
        while time.monotonic() < deadline and any(
            p.process.poll() is None for p in self.procs.values()
        ):
            await asyncio.sleep(0.1)
        for proc in self.procs.values():
            if proc.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.process.pid, signal.SIGKILL)
                proc.process.wait()
            proc.log.close()


def is_tiny_model(model_dir: str | None) -> bool:
    """Whether local workers load the generated tiny model (what ``local_model_dir`` gives)."""
    return model_dir is not None and Path(model_dir).resolve() == TINY_DIR.resolve()


def local_model_dir(pool_model: str, override: str | None) -> str:
    """The model the local vLLM workers load; a named one (``tiny``, ``smollm2``) is made once."""
    model = override or pool_model
    if model in NAMED_MODELS:
        return str(named_model_dir(model))
    if not Path(model).exists():
        raise ConfigError(
            f"model {model!r} is not a local directory; local mode runs vLLM's CPU build on "
            f"a model on disk: use a named model in the pool ({', '.join(NAMED_MODELS)}), "
            "--model DIR, or --engine sim"
        )
    return model


def worker_options(
    local: LocalJob,
    engine: str,
    *,
    model: str | None = None,
    max_model_len: int | None = None,
    time_scale: float = 1.0,
    scripted_replies: bool = False,
    speculation: str | None = None,
) -> LocalWorkerOptions:
    """The local workers' options for ``engine``: what ``heddle run`` and the client start."""
    model_dir = None
    if engine == "vllm":
        from heddle.worker import check_vllm_environment  # noqa: PLC0415

        check_vllm_environment()  # before any worker starts: one sentence, not 20 tracebacks
        model_dir = local_model_dir(local.pool.model, model)
    return LocalWorkerOptions(
        engine=engine,
        model=model_dir,
        max_model_len=max_model_len
        or (local.pool.vllm.max_model_len if engine == "vllm" else None),
        time_scale=time_scale,
        scripted_replies=scripted_replies,
        log_dir=local.output.parent / "logs",
        speculation=_speculation(local.pool.speculation, speculation, engine),
    )


def _speculation(pool: Speculation, method: str | None, engine: str) -> Speculation:
    """The pool's speculation, its method overridden by ``heddle run --speculation``."""
    if method is not None:
        pool = Speculation.of(method, pool.num_speculative_tokens, pool.by_batch_size)
    if pool.on and engine != "vllm":
        raise ConfigError(
            f"speculation {pool.method!r} needs --engine vllm: the sim engine does not draft "
            "(heddle bench models speculation): add --speculation off, or run on vllm"
        )
    return pool
