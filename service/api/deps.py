"""Typed dependencies shared by the routes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from service.config import Settings


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
