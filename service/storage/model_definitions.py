"""Keras model definitions pushed by digest: bounded, checked against the allow-list, stored.

A definition is small (REPRO_MAX_MODEL_DEFINITION_BYTES, 4 MiB by default), so the body is
read into memory as it arrives and refused past that bound. It is kept only when its
SHA-256 equals the client's and the TensorFlow-free checker (worker.models.keras_definition)
accepts every object in it and finds its parameter count within REPRO_MAX_MODEL_PARAMETERS;
any refusal leaves neither a file nor a row behind.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session

from service.auth.tokens import Principal
from service.config import Settings
from service.errors import (
    BodyTooLarge,
    DigestMismatch,
    InvalidSpec,
    ModelDefinitionRefused,
    ServiceError,
)
from service.persistence.models import Experiment, ModelDefinition
from service.storage import blob_store, datasets
from service.storage.by_digest import ByDigest
from worker.data import arrays_fit
from worker.data.batch_source import DataInfo
from worker.errors import SpecError
from worker.models import data_fit, registry
from worker.models.keras_definition import (
    DefinitionInfo,
    DefinitionLimits,
    DefinitionRefused,
    check_activations,
    check_fits,
    read_definition,
)
from worker.spec import ExperimentSpec

ARCHIVE_NOTE = (
    "only the architecture (config.json) of this .keras archive is used: any weights in it "
    "are ignored, and each run starts from the initialisation its seed determines"
)


def _uses(digest: str) -> ColumnElement[bool]:
    return Experiment.model_digest == digest


STORE = ByDigest(
    ModelDefinition,
    _uses,
    noun="model definition",
    target_type="model_definition",
    action="model.push",
    command="model",
)
find = STORE.find
get = STORE.get


def limits(settings: Settings) -> DefinitionLimits:
    """The checker's bounds, from the settings."""
    return DefinitionLimits(
        max_bytes=settings.max_model_definition_bytes,
        max_depth=settings.max_model_definition_depth,
        max_layers=settings.max_model_definition_layers,
    )


async def receive(chunks: AsyncIterator[bytes], *, declared: str, max_bytes: int) -> bytes:
    """The whole body, at most `max_bytes` (BodyTooLarge past it, counted as it arrives),
    and DigestMismatch naming both digests unless its SHA-256 is `declared`."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(
                f"a model definition may be at most {max_bytes} bytes "
                "(REPRO_MAX_MODEL_DEFINITION_BYTES); nothing was stored"
            )
        parts.append(chunk)
    body = b"".join(parts)
    actual = "sha256:" + hashlib.sha256(body).hexdigest()
    if actual != declared:
        raise DigestMismatch(
            f"received {size} bytes with digest {actual}, not the declared {declared}; "
            "nothing was stored"
        )
    return body


def check(body: bytes, *, name: str, settings: Settings) -> DefinitionInfo:
    """What the definition is; ModelDefinitionRefused (422) naming the offending layer path
    and class, or the parameter count and the limit."""
    try:
        info = read_definition(body, limits=limits(settings))
        # The batch is the spec's, known at submit; a model whose one example is over the
        # bound can never train here.
        check_activations(info, batch_size=1, limit=settings.max_activation_elements)
    except DefinitionRefused as exc:
        raise ModelDefinitionRefused(
            f"{name!r} is not a model definition this service accepts: {exc}; nothing was stored",
            errors=[{"loc": exc.path or "body", "msg": str(exc)}],
        ) from None
    limit = settings.max_model_parameters
    if info.parameter_count > limit:
        msg = (
            f"the model has {info.parameter_count} parameters; this server allows at most "
            f"{limit} (REPRO_MAX_MODEL_PARAMETERS)"
        )
        raise ModelDefinitionRefused(
            f"{name!r}: {msg}; nothing was stored", errors=[{"loc": "body", "msg": msg}]
        )
    return info


def store(
    *, db: Session, body: bytes, digest: str, name: str, settings: Settings, actor: Principal
) -> tuple[ModelDefinition, bool]:
    """Check the definition and store it under its digest: (definition, created). Bytes
    already stored answer their existing record (created False)."""
    existing = find(db, digest)
    if existing is not None:
        store = blob_store.open_store(settings)
        return STORE.again(
            db, existing, put=lambda: store.put_bytes("models", digest, body), actor=actor
        )
    info = check(body, name=name, settings=settings)
    url = blob_store.open_store(settings).put_bytes("models", digest, body)
    definition = ModelDefinition(
        digest=digest,
        name=name,
        size=len(body),
        format=info.format,
        layer_count=len(info.layers),
        parameter_count=info.parameter_count,
        layers=info.layer_records(),
        storage_url=url,
        pushed_by_id=actor.token_id,
        pushed_by=actor.name,
    )
    details = {"digest": digest, "name": name, "size": len(body)}
    return STORE.keep(db, definition, actor=actor, details=details)


def require_held(
    db: Session, digest: str | None, *, loc: str = "model.definition", new: bool = True
) -> ModelDefinition | None:
    """The stored definition a spec names, or InvalidSpec (422) naming the digest when it
    is not stored or retention removed its bytes; for a new experiment (`new`), when it is
    archived too."""
    return None if digest is None else STORE.require(db, digest, loc=loc, new=new)


def require_usable(db: Session, spec: ExperimentSpec, settings: Settings) -> ModelDefinition | None:
    """The stored definition the spec names, after checking it can train here: InvalidSpec
    (422) naming `model.definition` when it is not stored, is over REPRO_MAX_MODEL_PARAMETERS
    or REPRO_MAX_ACTIVATION_ELEMENTS (for the spec's batch), or cannot take the spec's data
    (shapes, token ids, classes), where those are known."""
    definition = require_held(db, spec.model.definition)
    if definition is None:
        return None
    loc = "model.definition"
    if definition.parameter_count > settings.max_model_parameters:
        msg = (
            f"model definition {definition.digest} has {definition.parameter_count} parameters; "
            f"this server allows at most {settings.max_model_parameters} "
            "(REPRO_MAX_MODEL_PARAMETERS)"
        )
        raise InvalidSpec(msg, errors=[{"loc": loc, "msg": msg}])
    try:
        data = blob_store.read_bytes(definition.storage_url, definition.digest, settings=settings)
    except (OSError, ServiceError):
        return definition  # unreadable here: the worker checks it again and says why
    try:
        info = read_definition(data)
    except DefinitionRefused as exc:  # stored before this server's checks said so
        msg = f"model definition {definition.digest} is refused: {exc}"
        raise InvalidSpec(msg, errors=[{"loc": loc, "msg": msg}]) from None
    sample = _sample(db, spec, token_ids=data_fit.takes_token_ids(spec, info))
    try:
        if sample is not None:
            check_fits(info, sample)
        check_activations(
            info,
            batch_size=spec.dataset.batch_size,
            limit=settings.max_activation_elements,
            sample_shape=None if sample is None else tuple(sample.x_shape),
        )
    except DefinitionRefused as exc:
        msg = f"model definition {definition.digest} cannot take this data: {exc}"
        raise InvalidSpec(msg, errors=[{"loc": loc, "msg": msg}]) from None
    return definition


def _sample(db: Session, spec: ExperimentSpec, *, token_ids: bool) -> DataInfo | None:
    """One sample of the spec's data, where it is known without TensorFlow; InvalidSpec
    naming the field when the stored dataset cannot serve this model's input (token ids
    that would be scaled, float data for an integer input), as the job would find."""
    ds = spec.dataset
    try:
        if ds.generator != "arrays":
            return registry.sample_info(spec)
        described = datasets.described(db, ds.data)
        if described is None:
            return None
        return arrays_fit.describe(ds.params, described, ds, token_ids=token_ids)
    except arrays_fit.FitError as exc:
        msg = f"the dataset {ds.data} does not fit this spec: {exc.msg}"
        raise InvalidSpec(f"{exc.loc}: {msg}", errors=[{"loc": exc.loc, "msg": msg}]) from None
    except (SpecError, ValueError):  # the data's own checks report these
        return None
