"""Prometheus `/metrics`, and the queue's size per requirement for autoscalers."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from pydantic import BaseModel
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from service.api.deps import AnyRole, ReadSessionDep, principal_of
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.auth.tokens import GRANTS
from service.config import Settings
from service.errors import Forbidden
from service.persistence.models import Run

router = APIRouter(tags=["metrics"], route_class=JsonRoute)
scrape_router = APIRouter(tags=["metrics"])


# For scrapers, like /healthz for probes: outside the versioned API and its OpenAPI document
# (whose every operation asks for a token), described in the README instead.
@scrape_router.get("/metrics", response_class=Response, include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus metrics (text format): queue, verdicts, workers, claims, requests.

    Aggregate numbers only; without a token unless `REPRO_METRICS_TOKEN_REQUIRED` is set
    (then a token with the read role)."""
    settings: Settings = request.app.state.settings
    if settings.metrics_token_required:
        principal = await principal_of(request)
        principal.require("read")
    body = await run_in_threadpool(generate_latest, request.app.state.metrics_registry)
    return Response(body, media_type=CONTENT_TYPE_PLAIN_0_0_4)


class RequirementCount(BaseModel):
    """Runs queued and running that need one image and/or worker (none: any worker)."""

    required_image: str | None
    required_worker: str | None
    queued: int
    running: int


class QueueStats(BaseModel):
    """The queue's size, in total and per requirement, for autoscalers."""

    queued: int
    running: int
    by_requirement: list[RequirementCount]


@router.get("/queue/stats", response_model=QueueStats, responses=errors(422))
def queue_stats(db: ReadSessionDep, principal: AnyRole) -> QueueStats:
    """Runs queued and running, per required image and worker (read or work role).

    Scale workers on queued + running, so busy workers are not scaled away."""
    if principal.role not in GRANTS["read"] | GRANTS["work"]:
        raise Forbidden(f"role {principal.role!r} may not read the queue")
    rows = db.execute(
        select(Run.required_image, Run.required_worker, Run.status, func.count(Run.id))
        .where(Run.status.in_(("queued", "running")))
        .group_by(Run.required_image, Run.required_worker, Run.status)
    ).all()
    groups: dict[tuple[str | None, str | None], RequirementCount] = {}
    for image, worker, status, count in rows:
        group = groups.setdefault(
            (image, worker),
            RequirementCount(required_image=image, required_worker=worker, queued=0, running=0),
        )
        if status == "queued":
            group.queued = count
        else:
            group.running = count
    ordered = sorted(
        groups.values(), key=lambda g: (g.required_image or "", g.required_worker or "")
    )
    return QueueStats(
        queued=sum(g.queued for g in ordered),
        running=sum(g.running for g in ordered),
        by_requirement=ordered,
    )
