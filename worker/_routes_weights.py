"""``/v1/weights``: new weights in place, loaded from disk or pushed over a process group.

``POST /v1/weights`` loads a checkpoint under the worker's weight roots,
draining or keeping the steps in flight; ``/v1/weights/push`` receives weights
over a process group (``_weights_push``). The two never overlap.
"""

from __future__ import annotations

from fastapi import FastAPI

from heddle.exceptions import CheckpointError
from heddle.exceptions import RequestError as ApiError

from ._app_errors import error_responses
from ._app_state import WorkerState, refuse_when_unavailable
from ._engine import EngineError
from ._schemas import WeightsRequest, WeightsResponse
from ._weights import weights_path
from ._weights_push import add_push_routes

__all__ = ["add_weight_routes"]


def add_weight_routes(app: FastAPI, state: WorkerState, weights_roots: tuple[str, ...]) -> None:
    """``POST /v1/weights`` (directories under ``weights_roots`` only; none: it refuses
    every path) and the push routes on ``app``."""
    engine, m = state.engine, state.metrics

    @app.post(
        "/v1/weights",
        response_model=WeightsResponse,
        responses=error_responses(400, 409, 413, 422, 503),
    )
    async def load_weights(body: WeightsRequest) -> WeightsResponse:
        refuse_when_unavailable(state)
        if pushes.current is not None:
            raise ApiError(
                409,
                f"weights version {pushes.current.plan.version!r} are being pushed to this "
                "worker; load from disk once GET /v1/weights/push/{version} has answered",
            )
        try:
            weights_path(body.path, weights_roots)
        except CheckpointError as exc:
            m.weight_loads.labels("refused").inc()
            raise ApiError(422, str(exc)) from exc
        held = engine.weights
        if held is not None and (held.path, held.version) == (body.path, body.version):
            return WeightsResponse(
                path=body.path, version=body.version, loaded=False, load_s=0.0, drained_s=0.0
            )
        state.loading = body.version
        kept = len(state.busy) if body.mode == "keep" else 0
        try:
            # keep: steps in flight stay inside the paused engine (their KV kept), no drain
            drained_s = 0.0 if body.mode == "keep" else await state.settle()
            loaded = await engine.load_weights(body.path, body.version, keep=body.mode == "keep")
        except CheckpointError as exc:
            m.weight_loads.labels("refused").inc()
            version = held.version if held is not None else None
            raise ApiError(
                422, f"{exc}; the worker keeps serving weights version {version!r}"
            ) from exc
        except EngineError as exc:
            m.weight_loads.labels("failed").inc()
            raise ApiError(503, f"the engine failed while loading weights: {exc}") from exc
        finally:
            state.loading = None
        m.weight_loads.labels("loaded").inc()
        m.weight_load_s.set(loaded.load_s)
        return WeightsResponse(
            path=loaded.path,
            version=body.version,
            loaded=True,
            load_s=loaded.load_s,
            drained_s=drained_s,
            mode=body.mode,
            kept=kept,
        )

    # weights over a process group; never at the same time as a load from disk
    pushes = add_push_routes(
        app, engine, m, lambda: refuse_when_unavailable(state), lambda: state.loading
    )
