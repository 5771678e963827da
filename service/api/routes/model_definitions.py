"""Keras model definitions by digest: push (checked without TensorFlow), list, show, download."""

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
from service.persistence.models import ModelDefinition
from service.schemas import ModelDefinitionDetail, ModelDefinitionOut, ModelLayer, Page
from service.storage import by_digest
from service.storage import model_definitions as definitions

router = APIRouter(prefix="/models", tags=["models"], route_class=JsonRoute)

DigestPath = Annotated[str, stored.digest_path("the definition's")]


def _detail(db: Session, definition: ModelDefinition) -> ModelDefinitionDetail:
    return ModelDefinitionDetail(
        **ModelDefinitionOut.model_validate(definition).model_dump(),
        layers=[ModelLayer.model_validate(layer) for layer in definition.layers],
        **stored.used_by(definitions.STORE, db, definition, prefix="models"),
        note=definitions.ARCHIVE_NOTE if definition.format == "keras_archive" else None,
    )


@router.post("", **stored.push_route(ModelDefinitionDetail))
async def push(
    request: Request,
    response: Response,
    db: SessionDep,
    settings: SettingsDep,
    principal: SubmitAccess,
    x_content_sha256: stored.ContentDigest,
    name: stored.PushName,
) -> ModelDefinitionDetail:
    """Store a Keras model definition (`model.to_json()`, or a `.keras` archive of which
    only `config.json` is read: its weights are ignored) by digest.

    Kept only if its SHA-256 equals `X-Content-SHA256` (400 naming both otherwise) and every
    object in it is one of Keras's own classes on the server's allow-list (422 naming the
    layer path and class: `Lambda`, custom objects, modules outside keras), within
    `REPRO_MAX_MODEL_DEFINITION_DEPTH` and `_LAYERS`, and its parameter count within
    `REPRO_MAX_MODEL_PARAMETERS` (422). Past `REPRO_MAX_MODEL_DEFINITION_BYTES`: 413.
    A refusal stores nothing. Pushing bytes already stored answers 200 with the record
    (201 when retention had removed them: they are stored again).
    """
    digest = by_digest.declared_digest(x_content_sha256)
    by_digest.check_name(name)
    body = await definitions.receive(
        request.stream(), declared=digest, max_bytes=settings.max_model_definition_bytes
    )

    def keep() -> tuple[ModelDefinition, bool]:
        return definitions.store(
            db=db, body=body, digest=digest, name=name, settings=settings, actor=principal
        )

    return await stored.pushed(response, keep, lambda definition: _detail(db, definition))


@router.get("", response_model=Page[ModelDefinitionOut], responses=errors(422))
def list_definitions(
    db: ReadSessionDep,
    _: ReadAccess,
    limit: stored.Limit = 50,
    offset: Offset = 0,
    archived: Archived = "false",
) -> Page[ModelDefinitionOut]:
    """Model definitions, newest first; archived ones only when asked (`archived`)."""
    return stored.page_of(
        definitions.STORE, db, ModelDefinitionOut, limit=limit, offset=offset, archived=archived
    )


@router.get("/{digest}", response_model=ModelDefinitionDetail, responses=errors(404, 422))
def show(digest: DigestPath, db: ReadSessionDep, _: ReadAccess) -> ModelDefinitionDetail:
    """One definition: its layers with their parameter counts, the total, who pushed it, and
    which runs trained it."""
    return _detail(db, definitions.get(db, digest))


@router.get("/{digest}/content", response_class=FileResponse, responses=errors(403, 404, 422))
def content(digest: DigestPath, db: ReadSessionDep, principal: AnyRole) -> Response:
    """The definition's bytes. Readers may download any (404 for one not stored); a worker
    token only those of runs one of its workers holds (403 otherwise, stored or not)."""
    definition = definitions.STORE.readable(db, digest, principal)
    suffix = "keras" if definition.format == "keras_archive" else "json"
    filename = f"{definition.digest.removeprefix('sha256:')}.{suffix}"
    return stored.content_file(
        definition.storage_url, digest=definition.digest, filename=filename, principal=principal
    )


stored.add_archive_routes(
    router, definitions.STORE, detail=_detail, detail_model=ModelDefinitionDetail
)
