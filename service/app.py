"""The FastAPI application factory."""

from __future__ import annotations

import json

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.main import api_router, install_error_handlers
from service.api.routes import health
from service.auth import FailureLimiter
from service.bell import Bell
from service.config import Settings, get_settings
from service.db import make_engine, make_sessionmaker


class BodyLimit:
    """Answers 413 to a declared body over the limit before any route reads it.

    Artifact uploads are exempt: they stream to disk under their own, larger limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope["path"].endswith("/artifacts"):
            length = dict(scope["headers"]).get(b"content-length")
            if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
                await _reply(send, 413, f"request body larger than {self.max_bytes} bytes")
                return
        await self.app(scope, receive, send)


async def _reply(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    start: Message = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    await send(start)
    await send({"type": "http.response.body", "body": body})


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API app; the database must already be migrated (`repro db upgrade`)."""
    settings = settings or get_settings()
    app = FastAPI(title="Reprotrain", version="1", summary="Reproducible training as a service")
    engine = make_engine(settings.resolved_database_url)
    app.state.settings = settings
    app.state.engine = engine
    app.state.queue_bell, app.state.runs_bell = Bell(), Bell()
    app.state.sessionmaker = make_sessionmaker(engine, (app.state.queue_bell, app.state.runs_bell))
    app.state.auth_failures = FailureLimiter(
        settings.auth_failures_allowed, settings.auth_failure_window_seconds
    )
    app.include_router(health.router)
    app.include_router(api_router)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app
