"""The worker's HTTP API: trajectory-resident contexts in front of one engine.

``create_app`` composes the app from its parts: the engine's lifecycle
(``_lifecycle``), the state it holds (``_app_state``), the body limit, the
pool's token (``_auth``) and request counts (``_app_metrics``), errors as
sentences (``_app_errors``), and the routes per resource:
``_routes_trajectories``, ``_routes_drafts``, ``_routes_status`` (state,
probes, metrics) and ``_routes_weights``.
"""

from __future__ import annotations

from fastapi import FastAPI

from ._app_errors import add_error_handlers
from ._app_metrics import CountRequests
from ._app_state import WorkerState
from ._auth import BearerToken, document_auth
from ._body_limit import MAX_BODY_BYTES, BodyLimit
from ._drafts import DraftHistory
from ._engine import Engine
from ._lifecycle import engine_lifespan
from ._resident import DEFAULT_MAX_RESIDENT, DEFAULT_RESIDENT_TTL_S, ResidentContexts
from ._routes_drafts import add_draft_routes
from ._routes_status import add_probe_routes, add_state_route
from ._routes_trajectories import add_trajectory_routes
from ._routes_weights import add_weight_routes

__all__ = ["WorkerState", "create_app"]


def create_app(
    engine: Engine,
    *,
    grace_s: float = 30.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    token: str | None = None,
    engine_started: bool = False,
    max_resident: int = DEFAULT_MAX_RESIDENT,
    resident_ttl_s: float = DEFAULT_RESIDENT_TTL_S,
    weights_roots: tuple[str, ...] = (),
) -> FastAPI:
    """The worker app; the engine starts with the app (unless ``engine_started``: the
    caller started it) and stops with it.

    With ``token``, every route but the probes and /metrics needs it as a bearer token.
    At most ``max_resident`` contexts stay resident, none idle longer than
    ``resident_ttl_s`` (:mod:`._resident`). ``POST /v1/weights`` loads only directories
    under ``weights_roots`` (none: it refuses every path).
    """
    state = WorkerState(engine, grace_s, contexts=ResidentContexts(max_resident, resident_ttl_s))
    drafts = DraftHistory()  # texts inserted into the engine's suffix cache, per job and task

    app = FastAPI(
        title="Heddle worker", lifespan=engine_lifespan(state, engine_started=engine_started)
    )
    app.state.worker = state

    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    if token is not None:  # outside the body limit: a caller without the token sends nothing in
        app.add_middleware(BearerToken, token=token)
    app.add_middleware(CountRequests, counter=state.metrics.requests)
    document_auth(app)
    add_error_handlers(app, engine)

    add_trajectory_routes(app, state, drafts)
    add_draft_routes(app, state, drafts)
    add_state_route(app, state)
    add_weight_routes(app, state, weights_roots)
    add_probe_routes(app, state)
    return app
