"""What the routes of files stored by digest (datasets, model definitions, code bundles)
have in common: the push's header, name and answer, the list's paging, the detail's runs,
the download."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Header, Query, Response
from fastapi import Path as PathParam
from pydantic import BaseModel
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

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
    store: ByDigest[Row], db: Session, out: type[Out], *, limit: int, offset: int
) -> Page[Out]:
    """A page of the kind's records, newest first."""
    rows, total = store.page(db, limit=limit, offset=offset)
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
