"""Datasets by digest: push (streamed, verified), list, show, download."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.api.deps import (
    AnyRole,
    Offset,
    ReadAccess,
    ReadSessionDep,
    SessionDep,
    SettingsDep,
    SubmitAccess,
)
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.persistence.models import Dataset
from service.schemas import DatasetDetail, DatasetOut, Page
from service.storage import datasets

router = APIRouter(prefix="/datasets", tags=["datasets"], route_class=JsonRoute)

DigestPath = Annotated[
    str,
    PathParam(
        pattern=datasets.DECLARED_DIGEST,
        description="the dataset's digest, `sha256:<hex>` (the bare hex also works)",
    ),
]


def _detail(db: Session, dataset: Dataset) -> DatasetDetail:
    runs, total = datasets.runs_using(db, dataset.digest)
    return DatasetDetail(
        **DatasetOut.model_validate(dataset).model_dump(),
        runs=runs,
        runs_total=total,
        content_url=f"/api/v1/datasets/{dataset.digest}/content",
    )


@router.post(
    "",
    status_code=201,
    response_model=DatasetDetail,
    responses={
        200: {"model": DatasetDetail, "description": "these bytes were already stored"},
        **errors(400, 413, 422),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def push(
    request: Request,
    response: Response,
    db: SessionDep,
    settings: SettingsDep,
    principal: SubmitAccess,
    x_content_sha256: Annotated[
        str,
        Header(
            pattern=datasets.DECLARED_DIGEST,
            description="SHA-256 of the body, `sha256:<hex>` or the bare hex",
        ),
    ],
    name: Annotated[
        str,
        Query(pattern=datasets.NAME, description="a label for people; the digest identifies it"),
    ],
) -> DatasetDetail:
    """Store a dataset file (`.npz` of named numeric arrays, one row per sample) by digest.

    The body streams to disk while hashed; it is kept only if its SHA-256 equals
    `X-Content-SHA256` (400 naming both otherwise) and the dataset reader accepts every
    byte (422 with the reason: truncated or malformed, object dtypes, arrays that disagree
    on the number of samples, arrays declaring more than `REPRO_MAX_DATASET_INFLATED_BYTES`
    once inflated, refused before any is inflated). Past `REPRO_MAX_DATASET_BYTES`: 413.
    Pushing bytes already stored answers 200 with the existing record.
    """
    digest = datasets.declared_digest(x_content_sha256)
    datasets.check_name(name)
    directory = settings.resolved_datasets_dir
    spooled, size = await datasets.spool(
        request.stream(),
        directory=directory,
        declared=digest,
        max_bytes=settings.max_dataset_bytes,
    )

    def keep() -> DatasetDetail:
        # Reading every byte of a large file and the database work stay off the event loop.
        dataset, created = datasets.store(
            db=db,
            spooled=spooled,
            size=size,
            digest=digest,
            name=name,
            directory=directory,
            max_inflated_bytes=settings.max_dataset_inflated_bytes,
            actor=principal,
        )
        if not created:
            response.status_code = 200
        return _detail(db, dataset)

    try:
        return await run_in_threadpool(keep)
    finally:
        spooled.unlink(missing_ok=True)


@router.get("", response_model=Page[DatasetOut], responses=errors(422))
def list_datasets(
    db: ReadSessionDep,
    _: ReadAccess,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Offset = 0,
) -> Page[DatasetOut]:
    """Datasets, newest first."""
    rows, total = datasets.page(db, limit=limit, offset=offset)
    return Page(
        items=[DatasetOut.model_validate(d) for d in rows], total=total, limit=limit, offset=offset
    )


@router.get("/{digest}", response_model=DatasetDetail, responses=errors(404, 422))
def show(digest: DigestPath, db: ReadSessionDep, _: ReadAccess) -> DatasetDetail:
    """One dataset: name, size, format, arrays with shapes and dtypes, who pushed it, and
    which runs trained on it."""
    return _detail(db, datasets.get(db, digest))


@router.get("/{digest}/content", response_class=FileResponse, responses=errors(403, 404, 422))
def content(digest: DigestPath, db: ReadSessionDep, principal: AnyRole) -> FileResponse:
    """The dataset's bytes (`X-Content-SHA256` says their digest). Readers may download any
    (404 for one not stored); a worker token only those of runs one of its workers holds
    (403 otherwise, stored or not)."""
    dataset = datasets.readable(db, digest, principal)
    return FileResponse(
        datasets.local_path(dataset),
        media_type="application/octet-stream",
        headers={"X-Content-SHA256": dataset.digest, "X-Content-Type-Options": "nosniff"},
        filename=f"{dataset.digest.removeprefix('sha256:')}.{dataset.format}",
    )
