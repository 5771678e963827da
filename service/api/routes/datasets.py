"""Datasets by digest: push (streamed, verified), list, show, download."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse
from sqlalchemy.orm import Session

from service.api import stored
from service.api.deps import (
    AnyRole,
    Archived,
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
from service.storage import blob_store, by_digest, datasets

router = APIRouter(prefix="/datasets", tags=["datasets"], route_class=JsonRoute)

DigestPath = Annotated[str, stored.digest_path("the dataset's")]


def _detail(db: Session, dataset: Dataset) -> DatasetDetail:
    return DatasetDetail(
        **DatasetOut.model_validate(dataset).model_dump(),
        **stored.used_by(datasets.STORE, db, dataset, prefix="datasets"),
    )


@router.post("", **stored.push_route(DatasetDetail))
async def push(
    request: Request,
    response: Response,
    db: SessionDep,
    settings: SettingsDep,
    principal: SubmitAccess,
    x_content_sha256: stored.ContentDigest,
    name: stored.PushName,
) -> DatasetDetail:
    """Store a dataset file (`.npz` of named numeric arrays, one row per sample) by digest.

    The body streams to disk while hashed; it is kept only if its SHA-256 equals
    `X-Content-SHA256` (400 naming both otherwise) and the dataset reader accepts every
    byte (422 with the reason: truncated or malformed, object dtypes, arrays that disagree
    on the number of samples, arrays declaring more than `REPRO_MAX_DATASET_INFLATED_BYTES`
    once inflated, refused before any is inflated). Past `REPRO_MAX_DATASET_BYTES`: 413.
    Pushing bytes already stored answers 200 with the existing record (201 when retention
    had removed them: they are stored again).
    """
    digest = by_digest.declared_digest(x_content_sha256)
    by_digest.check_name(name)
    directory = settings.resolved_datasets_dir
    spooled, size = await by_digest.spool(
        request.stream(),
        directory=directory,
        declared=digest,
        max_bytes=settings.max_dataset_bytes,
    )

    def keep() -> tuple[Dataset, bool]:
        return datasets.store(
            db=db,
            spooled=spooled,
            size=size,
            digest=digest,
            name=name,
            store=blob_store.open_store(settings),
            max_inflated_bytes=settings.max_dataset_inflated_bytes,
            actor=principal,
        )

    try:
        return await stored.pushed(response, keep, lambda dataset: _detail(db, dataset))
    finally:
        spooled.unlink(missing_ok=True)


@router.get("", response_model=Page[DatasetOut], responses=errors(422))
def list_datasets(
    db: ReadSessionDep,
    _: ReadAccess,
    limit: stored.Limit = 50,
    offset: Offset = 0,
    archived: Archived = "false",
) -> Page[DatasetOut]:
    """Datasets, newest first; archived ones only when asked (`archived`)."""
    return stored.page_of(
        datasets.STORE, db, DatasetOut, limit=limit, offset=offset, archived=archived
    )


@router.get("/{digest}", response_model=DatasetDetail, responses=errors(404, 422))
def show(digest: DigestPath, db: ReadSessionDep, _: ReadAccess) -> DatasetDetail:
    """One dataset: name, size, format, arrays with shapes and dtypes, who pushed it, and
    which runs trained on it."""
    return _detail(db, datasets.get(db, digest))


@router.get("/{digest}/content", response_class=FileResponse, responses=errors(403, 404, 422))
def content(digest: DigestPath, db: ReadSessionDep, principal: AnyRole) -> Response:
    """The dataset's bytes (`X-Content-SHA256` says their digest). Readers may download any
    (404 for one not stored); a worker token only those of runs one of its workers holds
    (403 otherwise, stored or not)."""
    dataset = datasets.STORE.readable(db, digest, principal)
    filename = f"{dataset.digest.removeprefix('sha256:')}.{dataset.format}"
    return stored.content_file(
        dataset.storage_url, digest=dataset.digest, filename=filename, principal=principal
    )


stored.add_archive_routes(router, datasets.STORE, detail=_detail, detail_model=DatasetDetail)
