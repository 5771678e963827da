"""Runs: listing, detail, rerun by id, cancel, and live progress."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import AfterValidator, BaseModel
from sqlalchemy import Connection
from sqlalchemy.orm import Session
from starlette.types import Receive, Scope, Send

from service.api import reads, run_pages
from service.api.deps import (
    AdminAccess,
    Archived,
    IdPath,
    Offset,
    PriorityQuery,
    ReadAccess,
    SessionDep,
    SettingsDep,
    SubmitAccess,
    WaitingReadAccess,
)
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.api.views import run_detail, run_out, spot_check_out
from service.config import Settings
from service.errors import NotFound
from service.persistence.models import RUN_STATUSES, TERMINAL_STATUSES
from service.runs import by_hand, fair_share, labels, retention
from service.runs import experiments as svc
from service.runs import search as run_search
from service.runs.events import RunWatcher
from service.schemas import (
    MAX_ID,
    TAG_PATTERN,
    RunDetail,
    RunEdit,
    RunOut,
    RunPage,
    SpotCheckIn,
    SpotCheckOut,
)
from service.verification import spot_checks
from service.worker_schemas import StorableResult
from worker.record.hardware import MAX_CLASS_CHARS, REQUIREMENT_PATTERN

router = APIRouter(prefix="/runs", tags=["runs"], route_class=JsonRoute)

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
VerdictName = Literal["identical", "diverged", "incomparable", "reference", "none"]
Kind = Literal["train", "refine", "spot-check"]
SpotCheckName = Literal[
    "pending", "verified", "self-consistent", "failed", "no-other-worker", "error", "none"
]
# Open event streams look at their runs this often even when no write in this process woke
# them (one read for all of them), and send a comment when they were quiet this long.
_EVENTS_RECHECK_SECONDS = 1.0
_KEEPALIVE_SECONDS = 15.0
assert set(RUN_STATUSES) == set(Status.__args__)  # type: ignore[attr-defined]
assert {"pending", *spot_checks.OUTCOMES, "none"} == set(SpotCheckName.__args__)  # type: ignore[attr-defined]


def _json(model: BaseModel) -> Response:
    # Returned as a Response, the model is serialized once, here: FastAPI would otherwise
    # validate it again against `response_model` before serializing it.
    return Response(model.model_dump_json(), media_type="application/json")


Cursor = Annotated[
    str | None,
    Query(
        max_length=run_pages.MAX_CURSOR_CHARS,
        description="`next_cursor` of the previous page (absent: the newest runs)",
    ),
    AfterValidator(run_pages.checked_cursor),
]


@router.get("", response_model=RunPage, responses=errors(422))
async def list_runs(
    request: Request,
    _: ReadAccess,
    status: Status | None = None,
    experiment_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    verdict: VerdictName | None = None,
    kind: Kind = "train",
    spot_check: Annotated[
        SpotCheckName | None, Query(description="the newest spot check's outcome; none: never")
    ] = None,
    tag: Annotated[str | None, Query(pattern=TAG_PATTERN, description="runs with this tag")] = None,
    search: Annotated[
        str | None,
        Query(
            max_length=run_search.MAX_CHARS,
            description="clauses joined by `and`: `params.PATH OP VALUE`, `metrics.NAME OP "
            "NUMBER`, `tag = T`, `status`/`verdict`/`name`/`experiment` `= != ~` TEXT, e.g. "
            "`params.training.optimizer.params.learning_rate = 0.003 and metrics.accuracy > 0.5`",
        ),
    ] = None,
    archived: Archived = "false",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
    offset: Offset = 0,
    count: Annotated[bool, Query(description="also count every matching run (`total`)")] = False,
) -> Response:
    """Runs, newest first, filtered by status, experiment, verdict and tag, a page at a time.
    Archived runs are left out unless `archived` asks for them.

    Trainings by default; `kind=refine` lists the re-traces made by `POST /compare/refine`,
    `kind=spot-check` the segment replays made by `POST /runs/{id}/spot-checks`.
    Pass the page's `next_cursor` as `cursor` for the next page (None: that was the last);
    every page costs the same however deep. `total` is null unless `count=true`.
    """
    filters = run_pages.RunFilters(
        kind=kind,
        status=status,
        experiment_id=experiment_id,
        verdict=verdict,
        spot_check=spot_check,
        tag=tag,
        search=search.strip() if search and search.strip() else None,
        archived=archived,
    )
    if filters.search:
        run_search.parse(filters.search)  # a 422 saying what is wrong, before any read

    def page(db: Connection) -> Response:
        found = run_pages.list_runs(
            db=db, filters=filters, limit=limit, cursor=cursor, offset=offset, count=count
        )
        return Response(run_pages.page_json(found), media_type="application/json")

    return await reads.read_core(request, page)


@router.get("/{run_id}", response_model=RunDetail, responses=errors(404, 422))
async def get_run(
    request: Request, run_id: IdPath, settings: SettingsDep, _: ReadAccess
) -> Response:
    """Everything about one run: spec, seed, status, provenance, trace, verdict."""

    def detail(db: Session) -> Response:
        found = run_detail(db, run_id, settings=settings)
        if found is None:
            raise NotFound(f"run {run_id} does not exist")
        return _json(found)

    return await reads.read(request, detail)


@router.post(
    "/{run_id}/rerun", status_code=202, response_model=RunOut, responses=errors(404, 409, 422)
)
def rerun(
    run_id: IdPath,
    db: SessionDep,
    settings: SettingsDep,
    principal: SubmitAccess,
    priority: PriorityQuery = 0,
    on_worker: Annotated[
        bool,
        Query(description="retrain a run recorded by hand on a worker (required for one)"),
    ] = False,
    hardware: Annotated[
        str | None,
        Query(
            max_length=MAX_CLASS_CHARS,
            pattern=f"^any$|{REQUIREMENT_PATTERN}",
            description="run on this hardware class (or leading part: `gpu`), or `any`, "
            "instead of the run's own class; the comparison reports the change",
        ),
    ] = None,
) -> RunOut:
    """Queue a rerun: same experiment, spec, seed, code bundle and (when known) image, on
    the hardware class its run trained on unless `hardware` says otherwise."""
    priority = fair_share.check_priority(priority, principal)
    new = svc.rerun(
        db=db,
        run_id=run_id,
        actor=principal,
        settings=settings,
        priority=priority,
        on_worker=on_worker,
        hardware=hardware,
    )
    return run_out(db, new)


@router.post(
    "/{run_id}/result", response_model=RunOut, responses=errors(400, 403, 404, 409, 413, 422)
)
def report_by_hand(
    run_id: IdPath,
    body: StorableResult,
    db: SessionDep,
    settings: SettingsDep,
    principal: SubmitAccess,
) -> RunOut:
    """The result a script run by hand reports of itself when it ends (its run was recorded
    by `POST /experiments/by-hand`): trace, data fingerprints, metrics, provenance. Nothing
    checks its final fingerprint against a checkpoint; a repeated report is not written
    twice."""
    run = by_hand.record_result(
        db=db,
        run_id=run_id,
        result=body,
        principal=principal,
        max_sortable_metrics=settings.max_sortable_metrics,
    )
    return run_out(db, run)


@router.post(
    "/{run_id}/spot-checks",
    status_code=202,
    response_model=SpotCheckOut,
    responses=errors(400, 404, 409, 413, 422),
)
def spot_check(
    run_id: IdPath,
    db: SessionDep,
    settings: SettingsDep,
    principal: SubmitAccess,
    body: SpotCheckIn | None = None,
) -> SpotCheckOut:
    """Prove a succeeded training by replaying `segments` of its segments (between kept
    checkpoints), chosen at random by a recorded seed, on workers of another identity
    (worker token) than the one that trained it unless `allow_trainer`; each must end on the
    run's checkpoint bit for bit. A run holds at most
    `REPRO_MAX_PENDING_SPOT_CHECKS_PER_RUN` spot checks not yet ended (409 past it)."""
    asked = body or SpotCheckIn()
    found = spot_checks.request_spot_check(
        db=db,
        run_id=run_id,
        segments=asked.segments,
        seed=asked.seed,
        allow_trainer=asked.allow_trainer,
        settings=settings,
        actor=principal,
    )
    return spot_check_out(found, db=db, settings=settings)


@router.get("/{run_id}/spot-checks", response_model=list[SpotCheckOut], responses=errors(404, 422))
def run_spot_checks(
    run_id: IdPath, db: SessionDep, settings: SettingsDep, _: ReadAccess
) -> list[SpotCheckOut]:
    """The run's spot checks, newest first, with their outcomes."""
    found = spot_checks.spot_checks_of(db, run_id, settings)
    return [spot_check_out(c, db=db, settings=settings) for c in found]


@router.patch("/{run_id}", response_model=RunDetail, responses=errors(400, 404, 413, 415, 422))
def edit(
    run_id: IdPath,
    change: RunEdit,
    db: SessionDep,
    settings: SettingsDep,
    principal: SubmitAccess,
) -> Response:
    """Name a run, write its notes, set or change its tags: only the fields given change
    (`name`/`notes` null or "" clears; `tags` replaces the set, `add_tags`/`remove_tags`
    change it). Recorded in the audit log (`run.edit`)."""
    labels.edit(db=db, run_id=run_id, change=change, actor=principal)
    found = run_detail(db, run_id, settings=settings)
    if found is None:  # pragma: no cover - edited just now, and runs are never deleted
        raise NotFound(f"run {run_id} does not exist")
    return _json(found)


@router.post("/{run_id}/archive", response_model=RunOut, responses=errors(404, 409, 422))
def archive(run_id: IdPath, db: SessionDep, principal: SubmitAccess) -> RunOut:
    """Archive an ended run: `GET /runs` and the dashboard leave it out unless asked
    (`archived=true`); nothing of it is removed. Audit-logged (`run.archive`)."""
    return run_out(db, labels.archive(db=db, run_id=run_id, archived=True, actor=principal))


@router.delete("/{run_id}", status_code=204, responses=errors(404, 409, 422))
def delete_run(run_id: IdPath, db: SessionDep, admin: AdminAccess) -> Response:
    """Delete an ended run for good (admins): its record, its files no other run shares and
    its log. 409 while anything refers to it (its reruns, verdicts against it, refinements,
    spot checks): delete those first. Audit-logged (`run.delete`). To hide a run, archive
    it instead; its files go after the retention."""
    retention.delete_run(db, run_id=run_id, actor=admin)
    return Response(status_code=204)


@router.post("/{run_id}/unarchive", response_model=RunOut, responses=errors(404, 422))
def unarchive(run_id: IdPath, db: SessionDep, principal: SubmitAccess) -> RunOut:
    """Bring an archived run back into the lists. Audit-logged (`run.unarchive`)."""
    return run_out(db, labels.archive(db=db, run_id=run_id, archived=False, actor=principal))


@router.post("/{run_id}/cancel", response_model=RunOut, responses=errors(404, 409, 422))
def cancel(run_id: IdPath, db: SessionDep, principal: SubmitAccess) -> RunOut:
    """Cancel a queued or running run."""
    return run_out(db, svc.cancel(db=db, run_id=run_id, actor=principal))


def _watcher(request: Request) -> RunWatcher:
    # Made on first use, in the event loop that serves the streams.
    state = request.app.state
    if getattr(state, "run_watcher", None) is None:
        settings: Settings = state.settings
        state.run_watcher = RunWatcher(
            sessionmaker=state.read_sessionmaker,
            bell=state.runs_bell,
            max_streams=settings.max_event_streams,
            recheck_seconds=_EVENTS_RECHECK_SECONDS,
        )
    watcher: RunWatcher = state.run_watcher
    return watcher


class _EventStream(StreamingResponse):
    """A stream that lets go of its subscription however it ends (even if never started)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def _event(snapshot: dict[str, object]) -> str:
    return f"event: run\ndata: {json.dumps(snapshot)}\n\n"


async def _once(snapshot: dict[str, object]) -> AsyncIterator[str]:
    yield _event(snapshot)


@router.get(
    "/{run_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **errors(404, 422, 503)},
)
async def events(run_id: IdPath, request: Request, _: WaitingReadAccess) -> StreamingResponse:
    """Server-sent events: the run's status and progress whenever they change.

    An open stream holds no thread or database connection; past `REPRO_MAX_EVENT_STREAMS`
    open streams the server answers 503 with `Retry-After`.
    """
    watcher = _watcher(request)
    first = await watcher.snapshot(run_id)  # 404 before streaming
    if first["status"] in TERMINAL_STATUSES:
        return _EventStream(_once(first), on_close=lambda: None)
    sub = watcher.subscribe(run_id, first)

    async def stream() -> AsyncIterator[str]:
        sent = first
        yield _event(first)
        while not sub.ended:
            try:
                await asyncio.wait_for(sub.changed.wait(), _KEEPALIVE_SECONDS)
            except TimeoutError:
                yield ": keepalive\n\n"  # finds clients that left without closing
                continue
            sub.changed.clear()
            snapshot = watcher.latest(run_id)
            if snapshot is None or snapshot == sent:
                continue
            yield _event(snapshot)
            sent = snapshot
            if snapshot["status"] in TERMINAL_STATUSES:
                return

    return _EventStream(stream(), on_close=lambda: watcher.unsubscribe(sub))
