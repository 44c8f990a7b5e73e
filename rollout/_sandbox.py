"""A sandboxed Python run for ``reward: {type: code}`` (docs/rollouts.md, "Rewards").

What is enforced, per run: a fresh temporary directory as the working
directory (deleted after); an empty environment; ``python -I -S`` (no user
site, no site-packages, no PYTHON* variables: the standard library only); CPU
time (``RLIMIT_CPU``) and a wall-clock limit (the process group is killed);
address space (``RLIMIT_AS``), file size (``RLIMIT_FSIZE``, which also caps
stdout and stderr: they go to files), open files and no core dumps. When the
session runs as root, the program runs as ``nobody`` where ``nobody`` may run
this Python (else as the session's user; ``reward_info.user`` says which).
Not enforced: network access (that needs a network namespace, which an
unprivileged process cannot make) and reading world-readable files; on a
cluster, keep untrusted code away from the network with a NetworkPolicy on the
session pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import pwd
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SandboxLimits", "SandboxResult", "run_python"]

_LAUNCHER = """\
import resource, sys
cpu_s, memory_b, file_b = {cpu_s}, {memory_b}, {file_b}
# CPU: SIGXCPU at the soft limit, SIGKILL a second later (a handler cannot keep it going).
for kind, soft, hard in ((resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
                         (resource.RLIMIT_AS, memory_b, memory_b),
                         (resource.RLIMIT_FSIZE, file_b, file_b), (resource.RLIMIT_CORE, 0, 0),
                         (resource.RLIMIT_NOFILE, 64, 64)):
    resource.setrlimit(kind, (soft, hard))
sys.argv = ["main.py"]
with open("main.py", encoding="utf-8") as f:
    source = f.read()
exec(compile(source, "main.py", "exec"), {{"__name__": "__main__"}})
"""
_STDERR_TAIL = 2000


@dataclass(frozen=True)
class SandboxLimits:
    time_s: float = 10.0  # CPU seconds; the wall-clock limit is twice this plus 1 s
    memory_mib: int = 512  # address space, the interpreter's own included
    output_kib: int = 1024  # any file written, stdout and stderr included


@dataclass(frozen=True)
class SandboxResult:
    passed: bool  # exited 0 within the limits
    reason: str  # "passed", or why not, in a few words
    seconds: float
    exit_code: int | None  # None when killed at the wall-clock limit
    stderr_tail: str = ""
    user: str = ""  # who the program ran as

    def info(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "exit_code": self.exit_code,
            "user": self.user,
            "stderr_tail": self.stderr_tail[-500:],
        }


_NOBODY_CANNOT_RUN: list[bool] = []  # set once nobody was refused this interpreter


def _nobody() -> tuple[int, int] | None:
    """Who the program runs as when we are root: nobody, who cannot lift the limits."""
    if os.geteuid() != 0 or _NOBODY_CANNOT_RUN:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:  # pragma: no cover - every Linux has nobody
        return None
    return entry.pw_uid, entry.pw_gid


async def run_python(program: str, limits: SandboxLimits) -> SandboxResult:
    """Run ``program`` (Python source) under ``limits``; never raises for what it does."""
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="heddle-sandbox-"))
    try:
        (workdir / "main.py").write_text(program, encoding="utf-8")
        launcher = _LAUNCHER.format(
            cpu_s=max(1, math.ceil(limits.time_s)),
            memory_b=limits.memory_mib * 2**20,
            file_b=limits.output_kib * 2**10,
        )
        (workdir / "launch.py").write_text(launcher, encoding="utf-8")
        user = _nobody()
        if user is not None:  # nobody writes in the directory, and reads what is there
            workdir.chmod(0o777)
            for path in workdir.iterdir():
                path.chmod(0o644)
            try:
                return await _run(workdir, limits, user, started)
            except PermissionError:  # this Python sits where nobody may not go (e.g. /root)
                _NOBODY_CANNOT_RUN.append(True)
        return await _run(workdir, limits, None, started)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _run(
    workdir: Path, limits: SandboxLimits, user: tuple[int, int] | None, started: float
) -> SandboxResult:
    ids: dict[str, Any] = {}
    if user is not None:
        ids = {"user": user[0], "group": user[1], "extra_groups": []}
    with (workdir / "stdout").open("wb") as out, (workdir / "stderr").open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            "launch.py",
            cwd=workdir,
            env={},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own process group: a fork cannot outlive the kill
            **ids,
        )
        wall_s = 2 * limits.time_s + 1.0
        try:
            code: int | None = await asyncio.wait_for(proc.wait(), wall_s)
        except TimeoutError:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # what it left running, or itself
            if proc.returncode is None:
                await proc.wait()
    seconds = time.monotonic() - started
    stderr = (workdir / "stderr").read_bytes()[-_STDERR_TAIL:].decode("utf-8", "replace")
    who = "nobody" if user is not None else pwd.getpwuid(os.geteuid()).pw_name
    return SandboxResult(code == 0, _reason(code, stderr, limits), seconds, code, stderr, who)


def _reason(code: int | None, stderr: str, limits: SandboxLimits) -> str:
    if code == 0:
        return "passed"
    if code is None:
        return f"time limit: still running after {2 * limits.time_s + 1:g} s (wall clock)"
    if code in (-signal.SIGXCPU, -signal.SIGKILL):  # the address-space limit raises instead
        return f"time limit: {max(1, math.ceil(limits.time_s))} s of CPU"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if "MemoryError" in last:
        return f"memory limit: {limits.memory_mib} MiB"
    if code == -signal.SIGXFSZ or "File too large" in last:  # Python ignores SIGXFSZ
        return f"output limit: {limits.output_kib} KiB"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"failed: {last[:200]}" if last else f"failed: exit code {code}"
