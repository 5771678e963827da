"""Code bundles by digest: push a wheel (checked, never imported), list, show, download."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field
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
from service.persistence.models import CodeBundle
from service.schemas import Page, StoredState, UtcDatetime
from service.storage import blob_store, by_digest, code_bundles

router = APIRouter(prefix="/code", tags=["code"], route_class=JsonRoute)

DigestPath = Annotated[str, stored.digest_path("the bundle's")]


class CodeFile(BaseModel):
    path: str
    sha256: str
    size: int


class CodeEntryPoint(BaseModel):
    group: str
    name: str
    value: str


class CodeBundleOut(StoredState):
    """A pushed code bundle: its digest (what a spec's `code` names), its files with their
    digests, the components it declares, and who pushed it."""

    model_config = ConfigDict(from_attributes=True)

    digest: str
    name: str
    size: int
    wheel_filename: str
    entry_points: list[CodeEntryPoint]
    pushed_by: str
    created_at: UtcDatetime


class CodeBundleDetail(CodeBundleOut):
    """A bundle with its per-file manifest and the runs that used it (newest first)."""

    files: list[CodeFile]
    runs: list[int] = Field(default_factory=list)
    runs_total: int = 0
    content_url: str


def _detail(db: Session, bundle: CodeBundle) -> CodeBundleDetail:
    return CodeBundleDetail(
        **CodeBundleOut.model_validate(bundle).model_dump(),
        files=bundle.files,
        **stored.used_by(code_bundles.STORE, db, bundle, prefix="code"),
    )


@router.post("", **stored.push_route(CodeBundleDetail))
async def push(
    request: Request,
    response: Response,
    db: SessionDep,
    settings: SettingsDep,
    principal: SubmitAccess,
    x_content_sha256: stored.ContentDigest,
    name: stored.PushName,
    filename: Annotated[
        str, Query(pattern=code_bundles.WHEEL_FILENAME, description="the wheel's file name")
    ],
) -> CodeBundleDetail:
    """Store a wheel of user components by digest; it is checked, never imported.

    Kept only if its SHA-256 equals `X-Content-SHA256` (400) and it is a valid wheel: a zip
    of at most `REPRO_MAX_CODE_BUNDLE_FILES` files inflating to at most
    `REPRO_MAX_CODE_BUNDLE_INFLATED_BYTES`, no absolute or `..` paths or links, every file
    matching its RECORD digest, entry points only in the `reprotrain.generators`,
    `.architectures` and `.losses` groups (422 with the reason, naming any other group,
    otherwise; nothing stored). Past `REPRO_MAX_CODE_BUNDLE_BYTES`: 413. With
    `REPRO_ALLOW_CODE_BUNDLES=false`: 422. Pushing bytes already stored answers 200
    (201 when retention had removed them: they are stored again).
    """
    code_bundles.check_allowed(settings)
    digest = by_digest.declared_digest(x_content_sha256)
    by_digest.check_name(name)
    code_bundles.check_filename(filename)
    directory = settings.resolved_artifacts_dir / "code"
    spooled, size = await by_digest.spool(
        request.stream(),
        directory=directory,
        declared=digest,
        max_bytes=settings.max_code_bundle_bytes,
    )

    def keep() -> tuple[CodeBundle, bool]:
        return code_bundles.store(
            db=db,
            spooled=spooled,
            size=size,
            digest=digest,
            name=name,
            filename=filename,
            store=blob_store.open_store(settings),
            settings=settings,
            actor=principal,
        )

    try:
        return await stored.pushed(response, keep, lambda bundle: _detail(db, bundle))
    finally:
        spooled.unlink(missing_ok=True)


@router.get("", response_model=Page[CodeBundleOut], responses=errors(422))
def list_bundles(
    db: ReadSessionDep,
    _: ReadAccess,
    limit: stored.Limit = 50,
    offset: Offset = 0,
    archived: Archived = "false",
) -> Page[CodeBundleOut]:
    """Code bundles, newest first; archived ones only when asked (`archived`)."""
    return stored.page_of(
        code_bundles.STORE, db, CodeBundleOut, limit=limit, offset=offset, archived=archived
    )


@router.get("/{digest}", response_model=CodeBundleDetail, responses=errors(404, 422))
def show(digest: DigestPath, db: ReadSessionDep, _: ReadAccess) -> CodeBundleDetail:
    """One bundle: its files with their digests, its entry points, who pushed it, and which
    runs used it."""
    return _detail(db, code_bundles.get(db, digest))


@router.get("/{digest}/content", response_class=FileResponse, responses=errors(403, 404, 422))
def content(digest: DigestPath, db: ReadSessionDep, principal: AnyRole) -> Response:
    """The wheel's bytes. Readers may download any; a worker token only those of runs one of
    its workers holds (403 otherwise, stored or not)."""
    bundle = code_bundles.STORE.readable(db, digest, principal)
    return stored.content_file(
        bundle.storage_url,
        digest=bundle.digest,
        filename=bundle.wheel_filename,
        principal=principal,
    )


stored.add_archive_routes(router, code_bundles.STORE, detail=_detail, detail_model=CodeBundleDetail)
