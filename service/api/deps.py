"""Typed dependencies shared by the routes: session, settings, and who is calling."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service import auth
from service.auth import Permission, Principal
from service.config import Settings
from service.errors import Unauthorized
from service.schemas import MAX_ID


def get_db(request: Request) -> Iterator[Session]:
    """A session per request, closed afterwards (routes commit explicitly)."""
    with request.app.state.sessionmaker() as session:
        yield session


def get_app_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    settings: Settings = request.app.state.settings
    return settings


SessionDep = Annotated[Session, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
# Ids and offsets within what the database stores (422 beyond, never a crash).
IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
Offset = Annotated[int, Query(ge=0, le=MAX_ID)]


# Declares the scheme in the OpenAPI document; get_principal answers 401 itself.
_bearer = HTTPBearer(
    auto_error=False, description="An API token: `repro token create`, or the admin token"
)


def get_principal(
    request: Request,
    db: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller of a bearer token; 401 without a valid one, 429 after too many bad ones."""
    limiter: auth.FailureLimiter = request.app.state.auth_failures
    client = request.client.host if request.client else "unknown"
    token = credentials.credentials if credentials is not None else None
    try:
        if token is None:
            raise Unauthorized("send a bearer token: Authorization: Bearer <token>")
        return auth.verify(db, token)
    except Unauthorized:
        limited = limiter.failed(client, auth.token_identity(token))
        if limited is not None:
            raise limited from None
        raise
    finally:
        # Hold no connection between the token check and the route's own work: a request
        # waiting for a thread must not keep a connection a running thread waits for.
        db.close()


BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def principal_of(request: Request) -> Principal:
    """The caller, checked as by `get_principal_unpinned`, for a route whose need for a
    token depends on a setting (so the OpenAPI document does not declare one)."""
    return await get_principal_unpinned(request, await _bearer(request))


async def get_principal_unpinned(request: Request, credentials: BearerCredentials) -> Principal:
    """The caller, as `get_principal`, checked with a session of its own that is closed
    before this returns: for routes that then wait (streams, long polls), which must not
    pin a thread or a database connection meanwhile."""

    def check() -> Principal:
        with request.app.state.sessionmaker() as db:
            return get_principal(request, db, credentials)

    return await run_in_threadpool(check)


def require(permission: Permission) -> Callable[..., Principal]:
    """A dependency that admits only roles granted `permission` (403 for the others)."""

    def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        principal.require(permission)
        return principal

    return dependency


def require_unpinned(permission: Permission) -> Callable[..., Awaitable[Principal]]:
    """As `require`, for routes that wait: nothing is held once the checks are done."""

    async def dependency(
        principal: Annotated[Principal, Depends(get_principal_unpinned)],
    ) -> Principal:
        principal.require(permission)
        return principal

    return dependency


AnyRole = Annotated[Principal, Depends(get_principal)]
ReadAccess = Annotated[Principal, Depends(require("read"))]
SubmitAccess = Annotated[Principal, Depends(require("submit"))]
WorkAccess = Annotated[Principal, Depends(require("work"))]
AdminAccess = Annotated[Principal, Depends(require("admin"))]
# For routes that wait: the same checks, with nothing held once they are done.
WaitingReadAccess = Annotated[Principal, Depends(require_unpinned("read"))]
WaitingWorkAccess = Annotated[Principal, Depends(require_unpinned("work"))]
