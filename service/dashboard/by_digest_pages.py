"""What the pages of files stored by digest (datasets, model definitions) share: the list
a page at a time with digests shown as short as they stay apart, and the experiments and
runs that used one file."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from service.dashboard import run_rows
from service.dashboard.actions import perform
from service.dashboard.id_pages import id_page
from service.dashboard.session import Viewer
from service.dashboard.web import render
from service.persistence.archived import narrowed
from service.persistence.models import Experiment, Run
from service.schemas import MAX_ID
from service.storage.by_digest import DECLARED_DIGEST, ByDigest, Row

PAGE_SIZE = 50
USERS_LISTED = 100  # experiments and runs a file's page lists, newest first
SHORTEST_PREFIX = 12  # hex digits a digest is shown with, more where two on a page share them
Cursor = Annotated[int | None, Query(ge=1, le=MAX_ID)]
DigestPath = Annotated[str, Path(pattern=DECLARED_DIGEST)]


def unique_prefixes(digests: Sequence[str]) -> int:
    """The fewest hex digits (at least 12) that tell every digest shown apart."""
    hexes = {d.split(":", 1)[-1] for d in digests}
    n = SHORTEST_PREFIX
    while n < 64 and len({h[:n] for h in hexes}) < len(hexes):
        n += 1
    return n


def _url(path: str, **cursor: int | None) -> str:
    items = [(k, str(v)) for k, v in cursor.items() if v is not None]
    return f"{path}?" + urlencode(items) if items else path


def list_page(
    request: Request,
    viewer: Viewer,
    db: Session,
    store: ByDigest[Row],
    *,
    path: str,
    template: str,
    items: str,
    before: int | None,
    after: int | None,
    archived: bool = False,
) -> HTMLResponse:
    """The kind's files, newest first, a page at a time, handed to `template` as `items`:
    those not archived, or with `archived` only the archived ones."""
    row = store.row
    query = narrowed(select(row), row.archived_at, "true" if archived else "false")
    found = id_page(db, query, row.id, limit=PAGE_SIZE, before=before, after=after)
    listed: dict[str, Any] = {items: found.items}
    only = 1 if archived else None
    return render(
        request,
        template,
        viewer,
        **listed,
        archived=archived,
        path=path,
        prefix=unique_prefixes([d.digest for d in found.items]),
        newer_url=_url(path, archived=only, after=found.newer) if found.newer else None,
        older_url=_url(path, archived=only, before=found.older) if found.older else None,
        first_url=_url(path, archived=only) if before or after else None,
    )


def add_archive_actions(router: APIRouter, store: ByDigest[Row], *, path: str) -> None:
    """`POST {path}/{digest}/archive` and `/unarchive`: the page's buttons, back to it."""

    async def archive(request: Request, digest: DigestPath) -> RedirectResponse:
        return await _archived(request, store, digest, path=path, archived=True)

    async def unarchive(request: Request, digest: DigestPath) -> RedirectResponse:
        return await _archived(request, store, digest, path=path, archived=False)

    archive.__doc__ = f"Archive the {store.noun} (new experiments may not name it)."
    unarchive.__doc__ = f"Bring the archived {store.noun} back into the list."
    router.post(f"{path}/{{digest}}/archive")(archive)
    router.post(f"{path}/{{digest}}/unarchive")(unarchive)


async def _archived(
    request: Request, store: ByDigest[Row], digest: str, *, path: str, archived: bool
) -> RedirectResponse:
    def act(db: Session, viewer: Viewer, form: dict[str, str]) -> str:
        row = store.archive(db, store.get(db, digest), archived=archived, actor=viewer.principal)
        return f"{path}/{row.digest}"

    return await perform(request, act)


def users_of(db: Session, uses: ColumnElement[bool]) -> dict[str, Any]:
    """The experiments and runs for which `uses` holds, newest first, and counts."""
    experiments = select(Experiment).where(uses)
    runs = (
        select(Run, Experiment)
        .join(Experiment, Experiment.id == Run.experiment_id)
        .where(uses, Run.kind == "train")
    )
    count = func.count()
    return {
        "experiments": list(
            db.scalars(experiments.order_by(Experiment.id.desc()).limit(USERS_LISTED))
        ),
        "experiments_total": db.scalar(select(count).select_from(experiments.subquery())) or 0,
        "runs": run_rows.rows_of(
            db, [(r, e) for r, e in db.execute(runs.order_by(Run.id.desc()).limit(USERS_LISTED))]
        ),
        "runs_total": db.scalar(select(count).select_from(runs.subquery())) or 0,
    }
