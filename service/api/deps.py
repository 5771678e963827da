"""Typed dependencies shared by the routes: session, settings, and who is calling."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.auth import tokens as auth
from service.auth.token_cache import TokenCache
from service.auth.tokens import Permission, Principal
from service.config import Settings
from service.errors import Unauthorized
from service.persistence.archived import ArchivedChoice
from service.runs.fair_share import MAX_PRIORITY
from service.schemas import MAX_ID


def get_db(request: Request) -> Iterator[Session]:
    """A session per request, closed afterwards (routes commit explicitly)."""
    with request.app.state.sessionmaker() as session:
        yield session


def get_read_db(request: Request) -> Iterator[Session]:
    """A read-only session per request (see
    service.persistence.engine.make_read_sessionmaker), closed
    afterwards: for routes that only read."""
    with request.app.state.read_sessionmaker() as session:
        yield session


async def get_app_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    settings: Settings = request.app.state.settings
    return settings


SessionDep = Annotated[Session, Depends(get_db)]
ReadSessionDep = Annotated[Session, Depends(get_read_db)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
# Ids and offsets within what the database stores (422 beyond, never a crash).
IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
# A run's place in the queue: claims take higher priorities first; only an admin sets one.
PriorityQuery = Annotated[
    int,
    Query(
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="claims take runs of higher priority first (default 0; admin tokens only)",
    ),
]
Offset = Annotated[int, Query(ge=0, le=MAX_ID)]
Archived = Annotated[
    ArchivedChoice,
    Query(description="archived ones: left out (false), only them (true), or both (any)"),
]


# Declares the scheme in the OpenAPI document; get_principal answers 401 itself.
_bearer = HTTPBearer(
    auto_error=False, description="An API token: `repro token create`, or the admin token"
)


BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _verify(request: Request, db: Session, token: str | None) -> Principal:
    """The principal of `token` read from the database; 401, or 429 after too many bad ones."""
    limiter: auth.FailureLimiter = request.app.state.auth_failures
    client = request.client.host if request.client else "unknown"
    try:
        if token is None:
            raise Unauthorized("send a bearer token: Authorization: Bearer <token>")
        return auth.verify(db, token)
    except Unauthorized:
        limited = limiter.failed(client, auth.token_identity(token))
        if limited is not None:
            raise limited from None
        raise


async def get_principal(request: Request, credentials: BearerCredentials) -> Principal:
    """The caller of a bearer token; 401 without a valid one, 429 after too many bad ones.

    A token verified in the last `REPRO_TOKEN_CACHE_SECONDS` is answered from memory on the
    event loop (see service.auth.token_cache). Any other is checked in a thread with a session of
    its own, closed before this returns: a request waiting for a thread, or a route that
    then waits (streams, long polls), never holds a connection because of its token.
    """
    token = credentials.credentials if credentials is not None else None
    cache: TokenCache = request.app.state.token_cache
    if token is not None and (known := cache.get(token)) is not None:
        return known
    generation = auth.revocation_generation()  # before the read, so a revocation wins

    def check() -> Principal:
        with request.app.state.sessionmaker() as db:
            return _verify(request, db, token)

    principal = await run_in_threadpool(check)
    if token is not None:
        cache.put(token, principal, generation=generation)
    return principal


async def principal_of(request: Request) -> Principal:
    """The caller, checked as by `get_principal`, for a route whose need for a token
    depends on a setting (so the OpenAPI document does not declare one)."""
    return await get_principal(request, await _bearer(request))


def require(permission: Permission) -> Callable[..., Awaitable[Principal]]:
    """A dependency that admits only roles granted `permission` (403 for the others)."""

    async def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        principal.require(permission)
        return principal

    return dependency


# Every check above holds nothing once done; routes that wait use the same dependencies.
require_unpinned = require


AnyRole = Annotated[Principal, Depends(get_principal)]
ReadAccess = Annotated[Principal, Depends(require("read"))]
SubmitAccess = Annotated[Principal, Depends(require("submit"))]
WorkAccess = Annotated[Principal, Depends(require("work"))]
AdminAccess = Annotated[Principal, Depends(require("admin"))]
# For routes that wait: the same checks, with nothing held once they are done.
WaitingReadAccess = Annotated[Principal, Depends(require_unpinned("read"))]
WaitingWorkAccess = Annotated[Principal, Depends(require_unpinned("work"))]
