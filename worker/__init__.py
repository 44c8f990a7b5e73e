"""heddle.worker: the pod-side engine process (HTTP API over a vLLM or simulated engine).

Not built yet: see the worker issue. Depends on :mod:`heddle.scheduler` only for types.
"""

__all__: list[str] = []
