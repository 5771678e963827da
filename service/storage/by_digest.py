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
from service.errors import Conflict, DigestMismatch, Forbidden, InvalidSpec, MalformedBody, NotFound
from service.persistence.archived import narrowed
from service.persistence.file_modes import private_dir
from service.persistence.models import (
    CodeBundle,
    Dataset,
    Experiment,
    ModelDefinition,
    Run,
    Worker,
    utcnow,
)
from service.persistence.sql_datetimes import utc_iso
from service.storage import blob_store
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
    command: str  # the CLI's group for the kind: `repro {command} push`

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

    def page(
        self, db: Session, *, limit: int, offset: int, archived: str = "false"
    ) -> tuple[list[Row], int]:
        """Rows, newest first, and how many there are; archived ones as `archived` says."""
        query = narrowed(select(self.row), self.row.archived_at, archived)
        total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
        rows = db.scalars(query.order_by(self.row.id.desc()).limit(limit).offset(offset))
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

    def experiments_using(self, db: Session, digest: str, *, limit: int = 5) -> list[int]:
        """Ids of experiments (oldest first, at most `limit`) whose spec names the digest."""
        query = select(Experiment.id).where(self.uses(digest)).order_by(Experiment.id)
        return list(db.scalars(query.limit(limit)))

    def runs_listed(self, db: Session, digest: str, *, limit: int = 3) -> list[int]:
        """Ids of runs not archived (newest first, at most `limit`) that used the digest: while
        there is one, its bytes stay (its rerun and its comparisons need them)."""
        query = (
            select(Run.id)
            .join(Experiment, Experiment.id == Run.experiment_id)
            .where(self.uses(digest), Run.archived_at.is_(None))
            .order_by(Run.id.desc())
        )
        return list(db.scalars(query.limit(limit)))

    def require(self, db: Session, digest: str, *, loc: str, new: bool) -> Row:
        """The row a spec names at `loc`: InvalidSpec (422) when it is not stored, and see
        `require_available`."""
        found = self.find(db, digest)
        if found is None:
            msg = (
                f"no {self.noun} {digest} is stored on this server; push it first "
                f"(repro {self.command} push)"
            )
            raise InvalidSpec(f"{loc}: {msg}", errors=[{"loc": loc, "msg": msg}])
        self.require_available(found, loc=loc, new=new)
        return found

    def require_available(self, row: Row, *, loc: str, new: bool) -> None:
        """Refuse a file whose bytes retention removed (always: push it again to restore it)
        and, for a new experiment (`new`), an archived one: InvalidSpec at `loc` for a new
        experiment, Conflict for a rerun of an old one."""
        msg = None
        if row.files_collected_at is not None:
            msg = (
                f"the bytes of {self.noun} {row.digest} were removed on "
                f"{utc_iso(row.files_collected_at)}, after it had been archived longer than "
                f"the retention; push the same file again (repro {self.command} push) to "
                "restore it"
            )
        elif new and row.archived_at is not None:
            msg = (
                f"{self.noun} {row.digest} is archived: bring it back "
                f"(repro {self.command} archive --undo {row.digest}) to name it in a new "
                "experiment"
            )
        if msg is None:
            return
        if new:
            raise InvalidSpec(f"{loc}: {msg}", errors=[{"loc": loc, "msg": msg}])
        raise Conflict(msg)

    def archive(self, db: Session, row: Row, *, archived: bool, actor: Principal | None) -> Row:
        """Archive the file (lists leave it out, new experiments may not name it; runs that
        used it rerun as before), or bring it back. Audit-logged (`{target_type}.archive`,
        `.unarchive`)."""
        if (row.archived_at is not None) != archived:
            row.archived_at = utcnow() if archived else None
            audit(
                db=db,
                actor=actor,
                action=f"{self.target_type}.{'archive' if archived else 'unarchive'}",
                target_type=self.target_type,
                target_id=row.id,
                details={"digest": row.digest},
            )
        db.commit()
        return row

    def again(
        self, db: Session, row: Row, *, put: Callable[[], str], actor: Principal
    ) -> tuple[Row, bool]:
        """A push of bytes already recorded: their record (False), or, when retention had
        removed them, the record with its bytes stored again by `put`, no longer archived
        (True). Audit-logged (`{target_type}.restore`)."""
        if row.files_collected_at is None:
            return row, False
        row.storage_url = put()
        row.files_collected_at = None
        row.archived_at = None
        audit(
            db=db,
            actor=actor,
            action=f"{self.target_type}.restore",
            target_type=self.target_type,
            target_id=row.id,
            details={"digest": row.digest, "size": row.size},
        )
        db.commit()
        return row, True

    def delete(self, db: Session, row: Row, *, actor: Principal | None) -> None:
        """Delete the file for good, record and bytes (admins). Conflict while an experiment
        names it: delete those runs and experiments first, or archive it instead."""
        named = self.experiments_using(db, row.digest)
        if named:
            listed = ", ".join(map(str, named))
            raise Conflict(
                f"{self.noun} {row.digest} cannot be deleted: experiments {listed} name it; "
                "delete their runs and them first, or archive it"
            )
        url, collected = row.storage_url, row.files_collected_at is not None
        details = {"digest": row.digest, "name": row.name, "size": row.size}
        db.delete(row)
        audit(db=db, actor=actor, action=f"{self.target_type}.delete",
              target_type=self.target_type, target_id=row.id, details=details)  # fmt: skip
        db.commit()  # the record first: bytes without one are harmless, the reverse is not
        if not collected:
            blob_store.delete(url)

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
