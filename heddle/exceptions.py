"""Every exception Heddle raises on purpose.

One module, imported by all parts (the scheduler included, so it must stay
stdlib-only). Catch :class:`HeddleError` to catch them all. A few belong to a
boundary and are mapped there, so they do not derive from it: an HTTP request
refused with a status (:class:`RequestError` in the worker's API,
:class:`GatewayError` in the OpenAI-compatible gateway), an exchange that
failed below HTTP (:class:`HttpError`) and an engine that stopped
(:class:`EngineError`, a 503).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AddressInUseError",
    "CheckpointError",
    "ConfigError",
    "EngineError",
    "EngineInputError",
    "GatewayError",
    "HeddleError",
    "HttpError",
    "HttpTimeoutError",
    "InfeasibleError",
    "KubeApiError",
    "ManifestError",
    "OutputError",
    "RequestError",
    "RolloutFailedError",
    "StepFailedError",
    "TaskError",
    "ToolError",
    "WorkerError",
    "WorkerRejectedError",
    "WorkerUnavailableError",
    "WorkloadError",
]


class HeddleError(Exception):
    """Base class of every error Heddle raises deliberately."""


class ConfigError(HeddleError, ValueError):
    """A configuration value is invalid.

    The message quotes the bad value and says what would be valid, e.g.
    ``tensor-parallel size 3 does not divide gpus_per_node=8; use one of [1, 2, 4, 8]``.
    """


class AddressInUseError(ConfigError):
    """A server cannot listen where it was told: the address is taken.

    ``heddle`` exits with :attr:`exit_code` (75, sysexits' EX_TEMPFAIL) on it, so a
    launcher (the local pool) can tell it from other failures and retry on another port.
    """

    exit_code = 75


class WorkloadError(ConfigError):
    """A workload or cluster description is malformed (names the field at fault)."""


class InfeasibleError(HeddleError):
    """No plan satisfies the constraints (e.g. no TP mix fits the GPU budget)."""


class ManifestError(ConfigError):
    """A RolloutJob or EnginePool manifest is invalid (names the field, quotes the value)."""


class OutputError(HeddleError):
    """The output file cannot be used or written: held by another session, not a Heddle
    output, or the disk refused a write (full, read-only, a bad path)."""


class TaskError(ConfigError):
    """One task (a JSONL line or an inline entry) is malformed; the rest of the set goes on."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.reason = message


class WorkerError(HeddleError):
    """A worker did not complete a request."""

    def __init__(self, worker: str, message: str, status: int | None = None) -> None:
        super().__init__(f"worker {worker}: {message}")
        self.worker = worker
        self.status = status


class WorkerUnavailableError(WorkerError):
    """The worker is down, draining, overloaded or silent; the step can go to another one."""


class WorkerRejectedError(WorkerError):
    """The worker refused the request itself (4xx); sending it elsewhere would not help."""


class StepFailedError(WorkerError):
    """One step kept failing on workers that stayed ready; its retries are spent."""


class EngineInputError(HeddleError, ValueError):
    """An engine refused a step's input (a token id, a sampling value) as invalid.

    The worker answers 422: another worker would refuse it too, so it is never a 503.
    """


class CheckpointError(HeddleError):
    """A checkpoint cannot be loaded in place (missing, another architecture, other shapes).

    The message names the path and the cause; the engine keeps serving its old weights.
    """


class ToolError(HeddleError):
    """A tool call failed after its retries (timeout, connection, status, or a garbled reply)."""


class RolloutFailedError(HeddleError):
    """A rollout a trainer submitted (heddle.client) failed as a whole.

    The message names the job and the cause: the RolloutJob's ``Failed``
    condition on a cluster, the last line of ``heddle run``'s log locally.
    """


class KubeApiError(HeddleError):
    """The Kubernetes API server answered with an error status (the operator's client)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API {status}: {message}")
        self.status = status


# -- errors of an HTTP boundary, answered or retried there -----------------------------------
class EngineError(RuntimeError):
    """The engine failed; the worker answers 503 and stops reporting ready."""


class HttpError(Exception):
    """The exchange failed below HTTP: connection refused, reset, or a malformed reply."""


class HttpTimeoutError(HttpError):
    """No complete reply within the timeout."""


class RequestError(Exception):
    """A request the worker's API answers with ``status`` and a sentence saying what is wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class GatewayError(Exception):
    """A request the gateway refuses, with OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = (
            status,
            message,
            code,
            param,
            kind,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }
