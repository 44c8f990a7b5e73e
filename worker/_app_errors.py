"""A worker's errors as one JSON sentence each: the app's exception handlers, and the
error answers each route documents in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from heddle.exceptions import RequestError as ApiError

from ._engine import Engine
from ._schemas import FIELD_RANGES, TOKEN_ID_FIELDS, ErrorResponse
from ._speculation import SPECULATION_REFUSED_SAMPLING

__all__ = ["add_error_handlers", "error_responses", "outside_vocabulary"]


def outside_vocabulary(where: str, token_id: object, vocab_size: int) -> str:
    return (
        f"invalid request: {where} holds token id {token_id}, outside the model's "
        f"vocabulary [0, {vocab_size}); send ids its tokenizer produced"
    )


def _sentence(exc: RequestValidationError, vocab_size: int) -> tuple[int, str]:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        return (
            400,
            f"request body is not valid JSON: {detail.get('ctx', {}).get('error', '')}".strip(),
        )
    parts = []
    for e in errors:
        loc = tuple(str(x) for x in e.get("loc", ()))
        if loc == ("body",) and e.get("type") == "missing":
            return 422, "the request needs a JSON body (docs/worker-api.md shows each one)"
        if loc == ("body",) and e.get("type") in {"model_attributes_type", "model_type"}:
            # An array, a string, or a body not sent as JSON.
            return 422, "the request body must be a JSON object sent as application/json"
        where = ".".join(x for x in loc if x != "body") or "body"
        field_ = where.rpartition(".")[0]
        if field_ in TOKEN_ID_FIELDS and e.get("type") == "greater_than_equal":
            return 422, outside_vocabulary(field_, e.get("input"), vocab_size)
        bounds = FIELD_RANGES.get(where)
        if e.get("type") == "extra_forbidden" and loc[-1] in SPECULATION_REFUSED_SAMPLING:
            parts.append(
                f"{where} is not supported: vLLM refuses min_p and logit_bias wherever "
                "speculative decoding is configured, and a pool may speculate "
                "(spec.speculation); leave it out and shape sampling with temperature and top_p"
            )
        elif e.get("type") == "heddle":  # our validators' sentences name the field themselves
            parts.append(str(e.get("msg")))
        elif bounds is not None:
            parts.append(f"{where} must be a number in {bounds}, not {e.get('input')!r}")
        else:
            parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return 422, "invalid request: " + "; ".join(parts)


def _http_sentence(request: Request, exc: HTTPException) -> str:
    """Starlette's own errors (no route, wrong method, unreadable body) as sentences."""
    if exc.status_code == 404 and exc.detail == "Not Found":
        return (
            f"no endpoint {request.method} {request.url.path}; "
            "the worker's endpoints are listed in docs/worker-api.md and at /docs"
        )
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        return f"{request.url.path} does not take {request.method}; use one of: {allowed}"
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        return "request body could not be read: send a UTF-8 JSON object"
    return str(exc.detail)


_WHY = {
    400: "the body is not JSON, or the context would exceed the model's max length",
    404: "the trajectory is not resident on this worker",
    409: "a step of the trajectory is running",
    421: "the worker serves other weights than the step's weight_version",
    413: "the body is over the worker's --max-body-mib",
    422: "a field is invalid (named, with its valid range)",
    503: "not ready, loading weights, shutting down, or the engine failed: try another worker",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route answers: all ``{"error": ...}``."""
    return {s: {"model": ErrorResponse, "description": _WHY[s]} for s in statuses}


def add_error_handlers(app: FastAPI, engine: Engine) -> None:
    """Every error the app answers, as ``{"error": sentence}`` with its status."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = _sentence(exc, engine.vocab_size)
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": _http_sentence(request, exc)},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        # Uvicorn still logs the traceback; the client gets the same JSON shape as always.
        return JSONResponse(
            {
                "error": f"the worker failed on this request ({type(exc).__name__}: {exc}); "
                "this is a bug in the worker, please report it with the worker's log"
            },
            status_code=500,
        )
