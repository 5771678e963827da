"""Tokens, the audit log, and the collection of archived runs' files (admins only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import func, select

from service.api.deps import AdminAccess, IdPath, Offset, ReadSessionDep, SessionDep, SettingsDep
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.auth import tokens as auth
from service.persistence.models import ApiToken, AuditEvent
from service.runs import retention
from service.schemas import (
    AuditOut,
    CollectionOut,
    KeptRun,
    Page,
    PlainText,
    StoredFileOut,
    TokenCreated,
    TokenIn,
    TokenOut,
)

router = APIRouter(tags=["admin"], route_class=JsonRoute)


@router.post(
    "/tokens", status_code=201, response_model=TokenCreated, responses=errors(400, 413, 422)
)
def create_token(body: TokenIn, db: SessionDep, admin: AdminAccess) -> TokenCreated:
    """Create a token; its secret is in this response only."""
    row, secret = auth.create_token(
        db=db, name=body.name, role=body.role, expires_in_days=body.expires_in_days, creator=admin
    )
    return TokenCreated(**TokenOut.model_validate(row).model_dump(), token=secret)


@router.get("/tokens", response_model=list[TokenOut])
def list_tokens(db: ReadSessionDep, admin: AdminAccess) -> list[TokenOut]:
    """Every token (never their secrets)."""
    return [TokenOut.model_validate(t) for t in db.scalars(select(ApiToken).order_by(ApiToken.id))]


@router.post("/tokens/{token_id}/revoke", response_model=TokenOut, responses=errors(404, 409, 422))
def revoke_token(token_id: IdPath, db: SessionDep, admin: AdminAccess) -> TokenOut:
    """Revoke a token; requests with it fail from now on."""
    return TokenOut.model_validate(auth.revoke(db=db, token_id=token_id, actor=admin))


@router.get("/audit", response_model=Page[AuditOut], responses=errors(422))
def audit_log(
    db: ReadSessionDep,
    admin: AdminAccess,
    action: Annotated[PlainText | None, Query(max_length=40)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Offset = 0,
) -> Page[AuditOut]:
    """Who submitted, reran, cancelled or created tokens, newest first."""
    query = select(AuditEvent)
    if action is not None:
        query = query.where(AuditEvent.action == action)
    total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = db.scalars(query.order_by(AuditEvent.id.desc()).limit(limit).offset(offset))
    return Page(
        items=[AuditOut.model_validate(r) for r in rows], total=total, limit=limit, offset=offset
    )


@router.post("/admin/collect", response_model=CollectionOut, responses=errors(422))
def collect(
    db: SessionDep,
    settings: SettingsDep,
    admin: AdminAccess,
    dry_run: bool = False,
    retention_days: Annotated[float | None, Query(ge=0, le=36_500)] = None,
) -> CollectionOut:
    """Remove the files (checkpoints, model, job log) of runs archived longer than the
    retention (`REPRO_ARCHIVE_RETENTION_DAYS`, or `retention_days`); their records stay. A
    family's reference keeps its files while a rerun of it is not archived. Archived
    datasets, model definitions and code bundles lose their bytes too, once no run in the
    lists used them (their records stay; pushing the same file restores them). Each removal
    is in the audit log (`run.collect`, `dataset.collect`, ...). Run it daily, e.g. `repro
    admin collect` from a scheduled job."""
    days = settings.archive_retention_days if retention_days is None else retention_days
    found = retention.collect(db, retention_days=days, actor=admin, dry_run=dry_run)
    return CollectionOut(
        dry_run=dry_run,
        retention_days=days,
        cutoff=found.cutoff,
        runs=found.runs,
        files=found.files,
        bytes=found.bytes,
        kept=[KeptRun(run=r, why=w) for r, w in found.kept.items()],
        more=found.more,
        stored=[StoredFileOut.model_validate(f, from_attributes=True) for f in found.stored],
        stored_kept=[
            StoredFileOut.model_validate(f, from_attributes=True) for f in found.stored_kept
        ],
    )
