"""Typed dependencies shared by the routes: session, settings, and who is calling."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

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


def require(permission: Permission) -> Callable[..., Principal]:
    """A dependency that admits only roles granted `permission` (403 for the others)."""

    def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        principal.require(permission)
        return principal

    return dependency


AnyRole = Annotated[Principal, Depends(get_principal)]
ReadAccess = Annotated[Principal, Depends(require("read"))]
SubmitAccess = Annotated[Principal, Depends(require("submit"))]
WorkAccess = Annotated[Principal, Depends(require("work"))]
AdminAccess = Annotated[Principal, Depends(require("admin"))]
