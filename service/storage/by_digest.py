"""Files users push once and the server keeps by content digest: datasets, Keras model
definitions and code bundles share how they are named, found, listed, guarded and stored.

Each kind's own module keeps what is really its own (what it accepts, how it reads the
bytes, what a spec may say about it) and a `ByDigest` for the rest: the row class, the
condition that says an experiment uses a digest, and the noun its messages use.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.auth.tokens import GRANTS, Principal, audit
from service.errors import DigestMismatch, Forbidden, MalformedBody, NotFound
from service.persistence.file_modes import private_dir
from service.persistence.models import CodeBundle, Dataset, Experiment, ModelDefinition, Run, Worker
from service.storage.artifacts import write_hashed

DIGEST = r"^sha256:[0-9a-f]{64}$"
# What a client may send as the digest: `sha256:<hex>` or the bare hex (as for artifacts).
DECLARED_DIGEST = r"^(sha256:)?[0-9a-fA-F]{64}$"
NAME = r"^[^\x00-\x1f\x7f]{1,200}$"  # a label, shown on pages: no control characters
RUNS_LISTED = 100  # run ids a detail lists (newest first); `runs_total` counts all

# Constrained, not bound: each kind's columns are SQLAlchemy attributes mypy can check.
Row = TypeVar("Row", Dataset, ModelDefinition, CodeBundle)


def declared_digest(value: str | None) -> str:
    """The client's digest as `sha256:<hex>`, lower-cased; MalformedBody when it is not one."""
    text = (value or "").strip()
    if not re.fullmatch(DECLARED_DIGEST, text):
        raise MalformedBody("X-Content-SHA256 must be the SHA-256 of the body: sha256:<64 hex>")
    return "sha256:" + text.removeprefix("sha256:").lower()


def check_name(name: str) -> str:
    """The pushed file's name; MalformedBody for an empty, long or control-character name."""
    if not re.fullmatch(NAME, name):
        raise MalformedBody("a dataset name is 1 to 200 characters without control characters")
    return name


async def spool(
    chunks: AsyncIterator[bytes], *, directory: Path, declared: str, max_bytes: int
) -> tuple[Path, int]:
    """The upload in a temporary file of the store, its digest checked: (path, size).

    BodyTooLarge past `max_bytes`, DigestMismatch (naming both digests) when the bytes are
    not the declared ones; either way the temporary file is gone.
    """
    private_dir(directory)
    tmp = directory / f".upload-{secrets.token_hex(8)}.part"
    try:
        hexdigest, size = await write_hashed(chunks, tmp, max_bytes=max_bytes, what="dataset")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    actual = f"sha256:{hexdigest}"
    if actual != declared:
        tmp.unlink(missing_ok=True)
        raise DigestMismatch(
            f"received {size} bytes with digest {actual}, not the declared {declared}; "
            "nothing was stored"
        )
    return tmp, size


@dataclass(frozen=True)
class ByDigest(Generic[Row]):
    """One kind of file stored by digest: its rows, which experiments use one, its noun."""

    row: type[Row]
    uses: Callable[[str], ColumnElement[bool]]  # experiments whose spec names the digest
    noun: str  # in messages: "no {noun} ... is stored"
    target_type: str  # the audit trail's name for the kind
    action: str  # the audit trail's name for a push

    def find(self, db: Session, digest: str) -> Row | None:
        """The row of `digest`, if stored."""
        return db.scalar(select(self.row).where(self.row.digest == digest))

    def get(self, db: Session, digest: str) -> Row:
        """The row of `digest` (`sha256:<hex>` or bare hex), or NotFound."""
        text = digest.strip().lower()
        normal = text if text.startswith("sha256:") else f"sha256:{text}"
        found = self.find(db, normal) if re.fullmatch(DIGEST, normal) else None
        if found is None:
            raise NotFound(f"no {self.noun} {digest} is stored")
        return found

    def page(self, db: Session, *, limit: int, offset: int) -> tuple[list[Row], int]:
        """Rows, newest first, and how many there are."""
        total = db.scalar(select(func.count(self.row.id))) or 0
        rows = db.scalars(select(self.row).order_by(self.row.id.desc()).limit(limit).offset(offset))
        return list(rows), total

    def runs_using(
        self, db: Session, digest: str, *, limit: int = RUNS_LISTED
    ) -> tuple[list[int], int]:
        """Ids of the runs (newest first, at most `limit`) whose spec names the digest, and
        how many there are."""
        query = (
            select(Run.id)
            .join(Experiment, Experiment.id == Run.experiment_id)
            .where(self.uses(digest))
        )
        total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
        ids = db.scalars(query.order_by(Run.id.desc()).limit(limit)).all()
        return list(ids), total

    def readable(self, db: Session, digest: str, principal: Principal) -> Row:
        """The row of `digest` if the caller may download it. A caller who may not read it
        gets Forbidden whether it is stored or not, so a worker token cannot learn which
        digests exist; readers get NotFound for an absent one."""
        found = None
        try:
            found = self.get(db, digest)
        except NotFound:
            if principal.role != "worker" and principal.role in GRANTS["read"]:
                raise
        if found is None or not self.may_read(db, found, principal):
            raise Forbidden(f"this token may not read {self.noun} {digest}")
        return found

    def may_read(self, db: Session, row: Row, principal: Principal) -> bool:
        """Whether the caller may download the file: any reader, or a worker token one of
        whose workers holds a running run that uses it."""
        if principal.role != "worker":
            return principal.role in GRANTS["read"]
        held = db.scalar(
            select(func.count(Run.id))
            .join(Worker, Worker.id == Run.worker_id)
            .join(Experiment, Experiment.id == Run.experiment_id)
            .where(Run.status == "running", Worker.token_id == principal.token_id)
            .where(self.uses(row.digest))
        )
        return bool(held)

    def keep(
        self, db: Session, row: Row, *, actor: Principal, details: dict[str, Any]
    ) -> tuple[Row, bool]:
        """Insert the new row and audit the push: (row, True); when the same bytes were
        pushed concurrently, the row stored first: (it, False)."""
        db.add(row)
        try:
            db.flush()
        except IntegrityError:  # the same bytes pushed concurrently: the first row stands
            db.rollback()
            found = self.find(db, row.digest)
            if found is None:
                raise
            return found, False
        audit(
            db=db,
            actor=actor,
            action=self.action,
            target_type=self.target_type,
            target_id=row.id,
            details=details,
        )
        db.commit()
        return row, True
