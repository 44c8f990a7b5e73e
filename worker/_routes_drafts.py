"""``POST /v1/drafts``: texts seeded into the engine's suffix cache (``_drafts.DraftHistory``)."""

from __future__ import annotations

from fastapi import FastAPI

from ._app_errors import error_responses
from ._app_state import WorkerState, check_vocab, refuse_when_unavailable
from ._drafts import DraftHistory
from ._schemas import SeedDraftsRequest, SeedDraftsResponse

__all__ = ["add_draft_routes"]


def add_draft_routes(app: FastAPI, state: WorkerState, drafts: DraftHistory) -> None:
    """``POST /v1/drafts`` on ``app``."""
    engine = state.engine

    @app.post(
        "/v1/drafts",
        response_model=SeedDraftsResponse,
        responses=error_responses(400, 413, 422, 503),
    )
    async def seed_drafts(body: SeedDraftsRequest) -> SeedDraftsResponse:
        """Texts the engine's suffix cache should draft from (siblings run elsewhere, earlier
        iterations of the task): inserted once each; a no-op where it does not run suffix."""
        refuse_when_unavailable(state)
        for i, text in enumerate(body.texts):
            check_vocab(engine, f"texts[{i}]", text)
        seeded = 0
        for key, tokens in drafts.new(body.job, body.task_id, body.texts):
            seeded += await engine.seed_drafts(key, tokens)
        return SeedDraftsResponse(seeded=seeded, held=drafts.held(body.job, body.task_id))
