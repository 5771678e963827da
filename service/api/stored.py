"""What the routes of files stored by digest (datasets, model definitions, code bundles)
have in common: the push's header, name and answer, the list's paging, the detail's runs,
the download."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Header, Query, Response
from fastapi import Path as PathParam
from pydantic import BaseModel
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.api.deps import AdminAccess, SessionDep, SubmitAccess
from service.api.responses import errors
from service.auth.tokens import Principal
from service.schemas import Page
from service.storage import blob_store
from service.storage.by_digest import DECLARED_DIGEST, NAME, ByDigest, Row

Stored = TypeVar("Stored")
Answer = TypeVar("Answer")
Out = TypeVar("Out", bound=BaseModel)

ContentDigest = Annotated[
    str,
    Header(
        pattern=DECLARED_DIGEST,
        description="SHA-256 of the body, `sha256:<hex>` or the bare hex",
    ),
]
PushName = Annotated[
    str, Query(pattern=NAME, description="a label for people; the digest identifies it")
]
Limit = Annotated[int, Query(ge=1, le=500)]


def digest_path(whose: str) -> Any:
    """The `{digest}` path parameter, described as `whose` digest."""
    return PathParam(
        pattern=DECLARED_DIGEST,
        description=f"{whose} digest, `sha256:<hex>` (the bare hex also works)",
    )


# The `{digest}` of the routes `add_archive_routes` adds, whatever their kind.
AnyDigest = Annotated[str, digest_path("the file's")]


def push_route(detail: type[BaseModel]) -> dict[str, Any]:
    """The push's OpenAPI: a binary body; 201 with the record, 200 for bytes already stored."""
    return {
        "status_code": 201,
        "response_model": detail,
        "responses": {
            200: {"model": detail, "description": "these bytes were already stored"},
            **errors(400, 413, 422),
        },
        "openapi_extra": {
            "requestBody": {
                "required": True,
                "content": {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
                },
            }
        },
    }


async def pushed(
    response: Response,
    keep: Callable[[], tuple[Stored, bool]],
    detail: Callable[[Stored], Answer],
) -> Answer:
    """Store off the event loop and answer the record: 201 when new, 200 when already stored."""

    def run() -> Answer:
        # Reading every byte of a large file and the database work stay off the event loop.
        row, created = keep()
        if not created:
            response.status_code = 200
        return detail(row)

    return await run_in_threadpool(run)


def page_of(
    store: ByDigest[Row],
    db: Session,
    out: type[Out],
    *,
    limit: int,
    offset: int,
    archived: str = "false",
) -> Page[Out]:
    """A page of the kind's records, newest first; archived ones as `archived` says."""
    rows, total = store.page(db, limit=limit, offset=offset, archived=archived)
    items = [out.model_validate(row) for row in rows]
    return Page(items=items, total=total, limit=limit, offset=offset)


def used_by(store: ByDigest[Row], db: Session, row: Row, *, prefix: str) -> dict[str, Any]:
    """The detail's runs that used the file, their count, and where to download it."""
    runs, total = store.runs_using(db, row.digest)
    return {
        "runs": runs,
        "runs_total": total,
        "content_url": f"/api/v1/{prefix}/{row.digest}/content",
    }


def content_file(url: str, *, digest: str, filename: str, principal: Principal) -> Response:
    """The stored bytes (or a redirect to them in the object store), with their digest in
    `X-Content-SHA256`."""
    return blob_store.download_response(
        url, sha256=digest, filename=filename, for_worker=principal.role == "worker"
    )


def add_archive_routes(
    router: APIRouter,
    store: ByDigest[Row],
    *,
    detail: Callable[[Session, Row], BaseModel],
    detail_model: type[BaseModel],
) -> None:
    """`POST /{digest}/archive`, `POST /{digest}/unarchive` and `DELETE /{digest}` (admins)
    for the kind of `store`, answering its detail (the delete: 204)."""
    noun = store.noun

    def archive(digest: AnyDigest, db: SessionDep, principal: SubmitAccess) -> BaseModel:
        return detail(db, store.archive(db, store.get(db, digest), archived=True, actor=principal))

    def unarchive(digest: AnyDigest, db: SessionDep, principal: SubmitAccess) -> BaseModel:
        row = store.archive(db, store.get(db, digest), archived=False, actor=principal)
        return detail(db, row)

    def delete(digest: AnyDigest, db: SessionDep, admin: AdminAccess) -> Response:
        store.delete(db, store.get(db, digest), actor=admin)
        return Response(status_code=204)

    archive.__doc__ = (
        f"Archive the {noun}: lists leave it out unless asked (`archived=true`), new "
        "experiments may not name it, runs that used it rerun as before. Once archived "
        "longer than the retention and no run in the lists used it, `POST /admin/collect` "
        "removes its bytes (pushing the same file again restores them). Audit-logged."
    )
    unarchive.__doc__ = f"Bring an archived {noun} back into the lists. Audit-logged."
    delete.__doc__ = (
        f"Delete the {noun} for good, record and bytes (admins). 409 while an experiment "
        "names it: delete their runs and them first, or archive it. Audit-logged."
    )
    router.post("/{digest}/archive", response_model=detail_model, responses=errors(404, 422))(
        archive
    )
    router.post("/{digest}/unarchive", response_model=detail_model, responses=errors(404, 422))(
        unarchive
    )
    router.delete("/{digest}", status_code=204, responses=errors(404, 409, 422))(delete)
