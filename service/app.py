"""The FastAPI application factory."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service.api.body_limits import BodyLimits
from service.api.docs import install_docs
from service.api.main import api_router, install_error_handlers
from service.api.reads import LoopReads
from service.api.routes import health
from service.api.routes import metrics as metrics_routes
from service.auth.token_cache import TokenCache
from service.auth.tokens import FailureLimiter
from service.config import Settings, get_settings
from service.dashboard import install_dashboard
from service.metrics import RequestTimer, make_registry
from service.persistence.engine import make_engine, make_read_sessionmaker, make_sessionmaker
from service.runs.wakeups import app_bells
from service.storage import artifacts
from service.storage.s3_store import s3_store


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    # The event loop's own connections go with it (the engine's are closed at exit).
    await app.state.loop_reads.dispose()


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API app; the database must already be migrated (`repro db upgrade`)."""
    settings = settings or get_settings()
    app = FastAPI(
        title="Reprotrain",
        version="1",
        summary="Reproducible training as a service",
        docs_url=None,  # served by install_docs from assets shipped in the package
        redoc_url=None,
        lifespan=_lifespan,
    )
    engine = make_engine(
        settings.resolved_database_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_pool_timeout_seconds,
    )
    app.state.settings = settings
    # Lapsed leases wait this long: workers that trained on while no API answered renew first.
    app.state.requeue_from = time.monotonic() + settings.resolved_lease_grace_seconds
    artifacts.sweep_partial_uploads(
        [settings.resolved_artifacts_dir, settings.resolved_datasets_dir]
    )
    if settings.storage_url:  # the object store answers, and holds no abandoned uploads
        store = s3_store(settings)
        store.check_bucket()
        store.sweep_staged()
    app.state.engine = engine
    app.state.queue_bell, app.state.runs_bell = app_bells()
    app.state.sessionmaker = make_sessionmaker(engine, (app.state.queue_bell, app.state.runs_bell))
    app.state.read_sessionmaker = make_read_sessionmaker(engine)
    app.state.loop_reads = LoopReads(
        engine,
        app.state.read_sessionmaker,
        pool_size=settings.db_read_pool_size,
        pool_timeout=settings.db_pool_timeout_seconds,
    )
    app.state.auth_failures = FailureLimiter(
        settings.auth_failures_allowed,
        settings.auth_failure_window_seconds,
        max_per_address=settings.auth_failures_per_address,
    )
    app.state.token_cache = TokenCache(settings.token_cache_seconds)
    app.state.metrics_registry = make_registry(
        maker=app.state.sessionmaker, settings=settings, state=app.state
    )
    app.include_router(health.router)
    app.include_router(metrics_routes.scrape_router)
    app.include_router(api_router)
    install_error_handlers(app)
    install_docs(app)
    install_dashboard(app, settings)
    app.add_middleware(BodyLimits, settings=settings)
    app.add_middleware(RequestTimer)  # outermost: times every answer, refusals included
    return app
