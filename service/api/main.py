"""The versioned API router and the one place domain errors become HTTP responses."""

from __future__ import annotations

import logging

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import TimeoutError as PoolTimeout

from service.api.responses import errors
from service.api.routes import (
    admin,
    artifact_uploads,
    code,
    compare,
    datasets,
    experiments,
    fleet,
    gangs,
    metrics,
    model_definitions,
    run_artifacts,
    runs,
    spot_checks,
    workers,
)
from service.errors import ServiceError, ServiceUnavailable

log = logging.getLogger(__name__)

# Every versioned endpoint needs a token its role allows, and answers 503 when no database
# connection comes free in time; each route adds its own errors.
api_router = APIRouter(prefix="/api/v1", responses=errors(401, 403, 429, 503))
api_router.include_router(experiments.router)
api_router.include_router(runs.router)
api_router.include_router(workers.router)
api_router.include_router(gangs.router)
api_router.include_router(artifact_uploads.router)
api_router.include_router(fleet.router)
api_router.include_router(admin.router)
api_router.include_router(compare.router)
api_router.include_router(metrics.router)
api_router.include_router(datasets.router)
api_router.include_router(code.router)
api_router.include_router(model_definitions.router)
api_router.include_router(run_artifacts.router)
api_router.include_router(spot_checks.router)


async def _service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    body: dict[str, object] = {"detail": str(exc)}
    if exc.errors:
        body["errors"] = exc.errors
    headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(exc.retry_after, 1))
    return JSONResponse(body, status_code=exc.status_code, headers=headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"], "type": e["type"]}
        for e in exc.errors()
    ]
    # A body that is not JSON at all is malformed (400), not a field problem (422).
    status = 400 if any(e["type"] == "json_invalid" for e in errors) else 422
    return JSONResponse({"detail": "invalid request", "errors": errors}, status_code=status)


async def _database_busy(request: Request, exc: Exception) -> JSONResponse:
    # Every connection of a pool stayed in use for REPRO_DB_POOL_TIMEOUT_SECONDS: the server
    # is at its limit, not broken, and the request changed nothing.
    log.warning(
        "%s %s: no database connection came free in time (%s)",
        request.method,
        request.url.path,
        exc,
    )
    return await _service_error(
        request,
        ServiceUnavailable("every database connection is busy; try again", retry_after=1),
    )


def install_error_handlers(app: FastAPI) -> None:
    """Map ServiceError subclasses, request validation and a database pool's timeout to
    their HTTP statuses."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(PoolTimeout, _database_busy)
