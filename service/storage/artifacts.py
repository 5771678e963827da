"""Artifact storage: streamed to a temporary file, digest-verified, then moved into place."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from service.config import Settings
from service.errors import BodyTooLarge, DigestMismatch, MalformedBody, NotFound
from service.persistence.file_modes import open_private, private_dir
from service.persistence.models import Artifact, Run
from service.storage import blob_store

# The API documents and validates both; check_upload holds for any other caller.
SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"  # a plain file name, never a path
SHA256_HEX = r"^[0-9a-fA-F]{64}$"
# An upload in progress writes its `.part` file as the bytes arrive (and a stalled one is
# cut off by the body timeout), so one untouched this long belongs to a server that stopped.
PARTIAL_UPLOAD_MAX_AGE_SECONDS = 3600.0
# The epoch checkpoints a run's spec writes: bounded by its epochs, not by the per-kind bounds.
_EPOCH_FILE = re.compile(r"^epoch-(\d{6})\.(npz|json)$")

log = logging.getLogger(__name__)


# The one file of kind "model" a run holds: a succeeded job's exported Keras model.
MODEL_FILE = "model.keras"


def check_upload(name: str, declared_sha256: str | None, *, kind: str = "checkpoint") -> str:
    """The declared digest, lower-cased; MalformedBody for a bad name or digest, or a model
    file not named MODEL_FILE (so a run holds one model, replaced by a later upload)."""
    if not re.fullmatch(SAFE_NAME, name):
        raise MalformedBody(f"artifact name {name!r} is not a plain file name")
    if kind == "model" and name != MODEL_FILE:
        raise MalformedBody(f"a run's model file is named {MODEL_FILE!r}, not {name!r}")
    digest = (declared_sha256 or "").lower()
    if not re.fullmatch(SHA256_HEX, digest):
        raise MalformedBody("X-Content-SHA256 must be the hex SHA-256 of the body")
    return digest


async def write_hashed(
    chunks: AsyncIterator[bytes], path: Path, *, max_bytes: int, what: str
) -> tuple[str, int]:
    """Write the stream to a new owner-only file, synced: (hex SHA-256, size).

    BodyTooLarge past `max_bytes` (counted as the bytes arrive); the caller removes `path`
    when anything fails.
    """
    h, size = hashlib.sha256(), 0
    with os.fdopen(open_private(path), "wb") as fh:
        async for chunk in chunks:
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge(f"{what} larger than {max_bytes} bytes")
            h.update(chunk)
            fh.write(chunk)
        fh.flush()
        os.fsync(fh.fileno())
    return h.hexdigest(), size


@dataclass(frozen=True)
class UploadBounds:
    """What one run may hold per artifact kind, beyond the epoch checkpoints of its spec."""

    files: int  # REPRO_MAX_RUN_ARTIFACT_FILES
    bytes: int  # REPRO_MAX_RUN_ARTIFACT_BYTES
    epochs: int  # the run's epochs: epoch-NNNNNN checkpoint files up to it are not counted
    file_bytes: int  # any one upload: REPRO_MAX_ARTIFACT_BYTES


def upload_bounds(run: Run, settings: Settings) -> UploadBounds:
    """The bounds on what `run` may upload, from the settings and its spec."""
    epochs = int(((run.experiment.spec or {}).get("training") or {}).get("epochs") or 0)
    return UploadBounds(
        files=settings.max_run_artifact_files,
        bytes=settings.max_run_artifact_bytes,
        epochs=epochs,
        file_bytes=settings.max_artifact_bytes,
    )


def counted(art_kind: str, name: str, epoch: int | None, epochs: int) -> bool:
    """Whether the file counts against the run's bounds (epoch checkpoints do not)."""
    found = _EPOCH_FILE.match(name) if art_kind == "checkpoint" else None
    return found is None or epoch != int(found.group(1)) or not 0 <= epoch <= epochs


def upload_room(
    db: Session, *, run: Run, kind: str, name: str, epoch: int | None, bounds: UploadBounds
) -> tuple[int, str]:
    """The bytes this upload may have within the run's bounds for its kind (it replaces a
    file of the same name), and what to call it past them; BodyTooLarge (413) when the run
    may hold no more of the kind."""
    if not counted(kind, name, epoch, bounds.epochs):
        return bounds.file_bytes, "artifact"
    held = db.execute(
        select(Artifact.name, Artifact.epoch, Artifact.size).where(
            Artifact.run_id == run.id, Artifact.kind == kind, Artifact.name != name
        )
    ).all()
    sizes = [size for other, at, size in held if counted(kind, other, at, bounds.epochs)]
    if len(sizes) >= bounds.files:
        raise BodyTooLarge(
            f"run {run.id} already holds {len(sizes)} {kind} files, the most one run may "
            "(REPRO_MAX_RUN_ARTIFACT_FILES); nothing was stored"
        )
    room = bounds.bytes - sum(sizes)
    if room <= 0:
        raise BodyTooLarge(
            f"run {run.id} already holds {sum(sizes)} bytes of {kind} files, the most one run "
            "may (REPRO_MAX_RUN_ARTIFACT_BYTES); nothing was stored"
        )
    if room >= bounds.file_bytes:
        return bounds.file_bytes, "artifact"
    held_bytes = bounds.bytes - room
    return room, (
        f"{kind} file: run {run.id} holds {held_bytes} bytes of them, and may hold "
        f"{bounds.bytes} (REPRO_MAX_RUN_ARTIFACT_BYTES); this one is"
    )


async def receive(
    chunks: AsyncIterator[bytes],
    *,
    directory: Path,
    name: str,
    declared_sha256: str,
    max_bytes: int,
    what: str = "artifact",
) -> tuple[Path, int]:
    """Stage the stream in a temporary file under `directory` if its digest matches.

    Returns (staged file, size); `record` moves the file into place, and the caller removes
    it if anything fails before. Nothing is left behind when the digest or size check fails.
    """
    private_dir(directory)  # artifacts are owner-only: 0600 files in 0700 directories
    tmp = directory / f".{name}.{os.getpid()}.{id(chunks)}.part"
    try:
        actual, size = await write_hashed(chunks, tmp, max_bytes=max_bytes, what=what)
        if actual != declared_sha256:
            raise DigestMismatch(
                f"received {size} bytes with SHA-256 {actual}, not {declared_sha256}"
            )
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, size


def lock_digests(db: Session, digests: Iterable[str]) -> None:
    """Hold the stored files of these digests until the transaction ends.

    Files are content-addressed and shared: a prune must not remove a file between its
    check that no artifact names the digest and the unlink, while an upload of the same
    bytes puts the file back and records its artifact. Both hold the digest meanwhile. On
    PostgreSQL that is a transaction-level advisory lock per digest (in a fixed order, so
    two holders never wait for each other). SQLite has one writer at a time, and both
    callers have written in this transaction before they call this, so they already hold
    the database's write lock until their commit.
    """
    if db.get_bind().dialect.name != "postgresql":
        return
    for digest in sorted(set(digests)):
        db.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": int(digest[:15], 16)})


def record(
    *,
    db: Session,
    run: Run,
    kind: str,
    name: str,
    epoch: int | None,
    sha256: str,
    size: int,
    place: Callable[[], str],
    bounds: UploadBounds | None = None,
) -> Artifact:
    """Put checked bytes in the store (`place` does, answering their storage URL) and create
    or replace the artifact row for (run, kind, name), holding the digest (`lock_digests`)
    from before the bytes are placed until the row is committed; BodyTooLarge, nothing
    stored, past the run's `bounds`."""
    art = db.scalar(
        select(Artifact).where(
            Artifact.run_id == run.id, Artifact.kind == kind, Artifact.name == name
        )
    )
    if art is None:
        art = Artifact(run_id=run.id, kind=kind, name=name)
        db.add(art)
    # A file of the same name with other bytes: its file goes unless another artifact has it.
    replaced = {art.sha256: art.storage_url} if art.sha256 not in (None, sha256) else {}
    art.epoch, art.sha256, art.size = epoch, sha256, size
    art.storage_url, art.attempt = "", run.attempt
    db.flush()  # the row is written first: on SQLite this takes the write lock
    if bounds is not None:  # again with the row in: concurrent uploads of the run wait here
        _check_held(db, run=run, kind=kind, bounds=bounds)
    lock_digests(db, [sha256, *replaced])
    art.storage_url = place()
    unlink_unshared(db, replaced)
    db.commit()
    return art


def _check_held(db: Session, *, run: Run, kind: str, bounds: UploadBounds) -> None:
    held = db.execute(
        select(Artifact.name, Artifact.epoch, Artifact.size).where(
            Artifact.run_id == run.id, Artifact.kind == kind
        )
    ).all()
    sizes = [size for name, at, size in held if counted(kind, name, at, bounds.epochs)]
    if len(sizes) > bounds.files or sum(sizes) > bounds.bytes:
        db.rollback()
        raise BodyTooLarge(
            f"run {run.id} may hold at most {bounds.files} {kind} files of {bounds.bytes} bytes "
            "in all (REPRO_MAX_RUN_ARTIFACT_FILES, REPRO_MAX_RUN_ARTIFACT_BYTES); nothing "
            "was stored"
        )


def unlink_unshared(db: Session, files: dict[str, str]) -> None:
    """Remove the stored bytes (by digest, their URL) that no artifact names any more.

    Call it holding the digests (`lock_digests`) and commit after: an upload of the same
    bytes then either committed its artifact before the check or puts the file back after
    the unlink.
    """
    if not files:
        return
    shared = set(db.scalars(select(Artifact.sha256).where(Artifact.sha256.in_(files))))
    for digest, url in files.items():
        if digest not in shared:
            blob_store.delete(url)


def delete(db: Session, arts: Iterable[Artifact]) -> int:
    """Delete the artifacts, and their stored files no other artifact shares; commits.

    Returns how many artifacts went.
    """
    arts = list(arts)
    if not arts:
        return 0
    files = {art.sha256: art.storage_url for art in arts}
    for art in arts:
        db.delete(art)
    db.flush()  # written first: on SQLite this takes the write lock (see lock_digests)
    lock_digests(db, files)
    unlink_unshared(db, files)
    # Should this commit fail, the rows stay without their files; a resume takes the newest
    # checkpoint, which is never removed while the run goes on.
    db.commit()
    return len(arts)


def get_artifact(db: Session, artifact_id: int) -> Artifact:
    """The artifact, or NotFound."""
    art = db.get(Artifact, artifact_id)
    if art is None:
        raise NotFound(f"artifact {artifact_id} does not exist")
    return art


def sweep_partial_uploads(
    directories: Iterable[Path], *, older_than: float = PARTIAL_UPLOAD_MAX_AGE_SECONDS
) -> int:
    """Remove the half-written uploads (`.*.part`) a stopped server left in `directories`,
    those untouched for `older_than` seconds; returns how many went."""
    cutoff = time.time() - older_than
    removed = 0
    for directory in directories:
        try:
            candidates = list(directory.glob(".*.part"))
        except OSError:
            continue
        for path in candidates:
            try:
                if path.is_file() and path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except OSError:  # gone meanwhile, or not ours to remove: leave it
                continue
    if removed:
        log.info("removed %d half-written upload(s) left by a stopped server", removed)
    return removed
