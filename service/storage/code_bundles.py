"""Code bundles pushed by digest: streamed in, checked without importing, stored by content.

A wheel is spooled like a dataset (bounded, hashed as it arrives); only when its digest is
the client's and `worker.models.code_bundles.inspect_wheel` accepts it is it renamed to its digest
and recorded with its per-file manifest and entry points. Any refusal leaves neither a
file nor a row. The server never imports a bundle: specs naming its components are checked
against the entry points recorded here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session

from service.auth.tokens import Principal
from service.config import Settings
from service.errors import CodeBundleRefused, Conflict, InvalidSpec, MalformedBody
from service.persistence.models import CodeBundle, Experiment
from service.storage.blob_store import BlobStore
from service.storage.by_digest import ByDigest
from worker.models.code_bundles import CodeBundleError, inspect_wheel

# A wheel's file name: name-version(-build)?-python-abi-platform.whl, no path.
WHEEL_FILENAME = r"^[A-Za-z0-9_.+!-]{1,250}\.whl$"
SWITCH_OFF = (
    "code bundles are turned off on this server (REPRO_ALLOW_CODE_BUNDLES=false): "
    "use built-in components or a model definition"
)


def _uses(digest: str) -> ColumnElement[bool]:
    return Experiment.code_digest == digest


STORE = ByDigest(
    CodeBundle,
    _uses,
    noun="code bundle",
    target_type="code_bundle",
    action="code.push",
    command="code",
)
find = STORE.find
get = STORE.get


def check_allowed(settings: Settings, *, loc: str | None = None) -> None:
    """CodeBundleRefused (or InvalidSpec at `loc`) when the operator turned bundles off."""
    if settings.allow_code_bundles:
        return
    if loc is None:
        raise CodeBundleRefused(SWITCH_OFF)
    raise InvalidSpec(f"{loc}: {SWITCH_OFF}", errors=[{"loc": loc, "msg": SWITCH_OFF}])


def check_queueing_allowed(settings: Settings, *, needs_code: bool, what: str) -> None:
    """Conflict (409) when `what` (a replay, a re-trace) would run a code bundle while the
    operator has turned bundles off: nothing is queued."""
    if needs_code and not settings.allow_code_bundles:
        raise Conflict(f"{what} runs a code bundle, and {SWITCH_OFF}; nothing was queued")


def check_filename(filename: str) -> str:
    """The wheel's file name; MalformedBody unless it is a plain `*.whl` name."""
    if not re.fullmatch(WHEEL_FILENAME, filename):
        raise MalformedBody("filename must be a wheel's file name: letters, digits, ._+!- and .whl")
    return filename


def store(
    *,
    db: Session,
    spooled: Path,
    size: int,
    digest: str,
    name: str,
    filename: str,
    store: BlobStore,
    settings: Settings,
    actor: Principal,
) -> tuple[CodeBundle, bool]:
    """Check the spooled wheel and store it under its digest: (bundle, created).

    CodeBundleRefused with the reason when it is not an acceptable bundle; a digest already
    stored answers its existing record (created False). The spooled file is always consumed.
    """
    try:
        existing = find(db, digest)
        if existing is not None:
            return STORE.again(
                db, existing, put=lambda: store.put_file("code", digest, spooled), actor=actor
            )
        try:
            info = inspect_wheel(
                spooled,
                max_members=settings.max_code_bundle_files,
                max_total_bytes=settings.max_code_bundle_inflated_bytes,
            )
        except CodeBundleError as exc:
            msg = f"{filename} is not a code bundle this service accepts: {exc}"
            if "more than" in str(exc):
                msg += " (REPRO_MAX_CODE_BUNDLE_FILES, REPRO_MAX_CODE_BUNDLE_INFLATED_BYTES)"
            raise CodeBundleRefused(f"{msg}; nothing was stored") from None
        url = store.put_file("code", digest, spooled)
        bundle = CodeBundle(
            digest=digest,
            name=name,
            size=size,
            wheel_filename=filename,
            files=info.files,
            entry_points=info.entry_points,
            storage_url=url,
            pushed_by_id=actor.token_id,
            pushed_by=actor.name,
        )
        details = {"digest": digest, "name": name, "size": size, "wheel": filename}
        return STORE.keep(db, bundle, actor=actor, details=details)
    finally:
        spooled.unlink(missing_ok=True)


def require_held(
    db: Session, digest: str | None, settings: Settings, *, new: bool = True
) -> CodeBundle | None:
    """The spec's bundle; InvalidSpec (422) at `code` when bundles are off (per `settings`),
    it is not stored here or retention removed its bytes, and for a new experiment (`new`)
    when it is archived (None for a spec without one)."""
    if digest is None:
        return None
    check_allowed(settings, loc="code")
    return STORE.require(db, digest, loc="code", new=new)


def entry_points_of(db: Session, digest: str | None) -> list[dict[str, Any]]:
    """The entry points a stored bundle declares ([] for none or an unknown digest)."""
    bundle = find(db, digest) if digest else None
    return list(bundle.entry_points) if bundle is not None else []
