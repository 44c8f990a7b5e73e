"""What a worker counts: its Prometheus metrics, and requests by route and status.

``GET /metrics`` serves the registry (``_routes_status``); the counters are
fed by the routes and by :class:`CountRequests`, a plain ASGI middleware.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

__all__ = ["CountRequests", "WorkerMetrics"]


class WorkerMetrics:
    """The worker's metrics, in a registry of its own (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "heddle_worker_requests",
            "API requests by route template and status",
            ["route", "status"],
            registry=r,
        )
        self.generated = Counter("heddle_worker_generated_tokens", "tokens generated", registry=r)
        self.prompt = Counter("heddle_worker_prompt_tokens", "context tokens of steps", registry=r)
        self.cached = Counter(
            "heddle_worker_cached_tokens", "context tokens served from the prefix cache", registry=r
        )
        self.step_latency = Histogram(
            "heddle_worker_step_seconds",
            "latency of one generate step",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.resident = Gauge("heddle_worker_resident_trajectories", "contexts held", registry=r)
        self.kv_usage = Gauge("heddle_worker_kv_usage", "KV cache in use (0..1)", registry=r)
        self.running = Gauge("heddle_worker_running", "steps running", registry=r)
        self.waiting = Gauge("heddle_worker_waiting", "steps waiting", registry=r)
        self.imports = Counter("heddle_worker_imports", "contexts imported (PUT)", registry=r)
        self.exports = Counter("heddle_worker_exports", "contexts exported (GET)", registry=r)
        self.dropped = Counter(
            "heddle_worker_dropped_contexts",
            "resident contexts dropped: over the cap, idle past the TTL, or a job's purge",
            ["reason"],
            registry=r,
        )
        self.max_resident = Gauge(
            "heddle_worker_max_resident_trajectories", "the cap on resident contexts", registry=r
        )
        self.weights = Info("heddle_worker_weights", "the weights served", registry=r)
        # Speculative decoding, per step as vLLM counts it for each request.
        self.drafted = Counter(
            "heddle_worker_drafted_tokens", "draft tokens proposed (speculation)", registry=r
        )
        self.accepted = Counter(
            "heddle_worker_accepted_tokens", "draft tokens accepted (speculation)", registry=r
        )
        self.draft_steps = Counter(
            "heddle_worker_draft_steps",
            "engine steps that verified a draft, per sequence",
            registry=r,
        )
        self.weight_loads = Counter(
            "heddle_worker_weight_loads", "in-place loads by result", ["result"], registry=r
        )
        self.weight_load_s = Gauge(
            "heddle_worker_weight_load_seconds", "duration of the last in-place load", registry=r
        )


class CountRequests:
    """Counts requests by route template and status, as plain ASGI.

    Starlette's ``@app.middleware("http")`` runs every request in an extra task
    with memory streams; at thousands of steps per second that was the
    worker's largest cost (docs/benchmarks.md, control-loop scale).
    """

    def __init__(self, app: Any, counter: Counter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def remember(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, remember)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")  # bounded labels
            self.counter.labels(f"{scope['method']} {route}", status[0]).inc()
