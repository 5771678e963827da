"""Datasets pushed by digest: streamed in, verified, inspected, stored content-addressed.

A dataset file is spooled to a temporary file beside the store while its SHA-256 is
computed, so memory stays bounded whatever its size. Only when the digest matches the
client's and the dataset reader accepts every byte of it is it renamed to its digest and
recorded; any refusal leaves neither a file nor a row behind.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.auth.tokens import GRANTS, Principal, audit
from service.errors import (
    DatasetRefused,
    DigestMismatch,
    Forbidden,
    InvalidSpec,
    MalformedBody,
    NotFound,
)
from service.persistence.file_modes import private_dir
from service.persistence.models import Dataset, Experiment, Run, Worker
from service.storage.artifacts import stored_path, write_hashed
from worker.data.dataset_format import DatasetFormatError, DatasetTooLarge, inspect_dataset

DIGEST = r"^sha256:[0-9a-f]{64}$"
# What a client may send as the digest: `sha256:<hex>` or the bare hex (as for artifacts).
DECLARED_DIGEST = r"^(sha256:)?[0-9a-fA-F]{64}$"
NAME = r"^[^\x00-\x1f\x7f]{1,200}$"  # a label, shown on pages: no control characters
RUNS_LISTED = 100  # run ids a dataset's detail lists (newest first); `runs_total` counts all


def declared_digest(value: str | None) -> str:
    """The client's digest as `sha256:<hex>`, lower-cased; MalformedBody when it is not one."""
    text = (value or "").strip()
    if not re.fullmatch(DECLARED_DIGEST, text):
        raise MalformedBody("X-Content-SHA256 must be the SHA-256 of the body: sha256:<64 hex>")
    return "sha256:" + text.removeprefix("sha256:").lower()


def check_name(name: str) -> str:
    """The dataset's name; MalformedBody for an empty, long or control-character name."""
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


def store(
    *,
    db: Session,
    spooled: Path,
    size: int,
    digest: str,
    name: str,
    directory: Path,
    max_inflated_bytes: int,
    actor: Principal,
) -> tuple[Dataset, bool]:
    """Inspect the spooled file and store it under its digest: (dataset, created).

    DatasetRefused with the reader's reason, naming the upload by `name`, when it is not
    an acceptable dataset or its arrays declare more than `max_inflated_bytes` (checked
    before anything is inflated). A digest already stored answers its existing record
    (created False): pushing is idempotent. The spooled file is always consumed.
    """
    try:
        existing = find(db, digest)
        if existing is not None:
            return existing, False
        try:
            info = inspect_dataset(spooled, max_bytes=max_inflated_bytes, label=repr(name))
        except DatasetTooLarge as exc:
            msg = f"{exc} (REPRO_MAX_DATASET_INFLATED_BYTES); nothing was stored"
            raise DatasetRefused(f"not a dataset this service accepts: {msg}") from None
        except DatasetFormatError as exc:
            raise DatasetRefused(f"not a dataset this service accepts: {exc}") from None
        final = stored_path(directory, digest)
        private_dir(final.parent)
        os.replace(spooled, final)
        dataset = Dataset(
            digest=digest,
            name=name,
            size=size,
            format=info.format,
            samples=info.samples,
            arrays=[
                {"name": a.name, "shape": list(a.shape), "dtype": a.dtype} for a in info.arrays
            ],
            storage_url=final.resolve().as_uri(),
            pushed_by_id=actor.token_id,
            pushed_by=actor.name,
        )
        db.add(dataset)
        try:
            db.flush()
        except IntegrityError:  # the same bytes pushed concurrently: the first row stands
            db.rollback()
            found = find(db, digest)
            if found is None:
                raise
            return found, False
        audit(
            db=db,
            actor=actor,
            action="dataset.push",
            target_type="dataset",
            target_id=dataset.id,
            details={"digest": digest, "name": name, "size": size},
        )
        db.commit()
        return dataset, True
    finally:
        spooled.unlink(missing_ok=True)


def find(db: Session, digest: str) -> Dataset | None:
    """The dataset of `digest`, if stored."""
    return db.scalar(select(Dataset).where(Dataset.digest == digest))


def get(db: Session, digest: str) -> Dataset:
    """The dataset of `digest` (`sha256:<hex>` or bare hex), or NotFound."""
    text = digest.strip().lower()
    normal = text if text.startswith("sha256:") else f"sha256:{text}"
    dataset = find(db, normal) if re.fullmatch(DIGEST, normal) else None
    if dataset is None:
        raise NotFound(f"no dataset {digest} is stored")
    return dataset


def page(db: Session, *, limit: int, offset: int) -> tuple[list[Dataset], int]:
    """Datasets, newest first, and how many there are."""
    total = db.scalar(select(func.count(Dataset.id))) or 0
    rows = db.scalars(select(Dataset).order_by(Dataset.id.desc()).limit(limit).offset(offset))
    return list(rows), total


def _uses(digest: str) -> Any:
    # JSON path comparison: json_extract on SQLite, ->> on PostgreSQL.
    return Experiment.spec["dataset"]["data"].as_string() == digest


def runs_using(db: Session, digest: str, *, limit: int = RUNS_LISTED) -> tuple[list[int], int]:
    """Ids of the runs (newest first, at most `limit`) whose spec names the dataset, and
    how many there are."""
    query = select(Run.id).join(Experiment, Experiment.id == Run.experiment_id).where(_uses(digest))
    total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
    ids = db.scalars(query.order_by(Run.id.desc()).limit(limit)).all()
    return list(ids), total


def readable(db: Session, digest: str, principal: Principal) -> Dataset:
    """The dataset of `digest` if the caller may download it. A caller who may not read it
    gets Forbidden whether it is stored or not, so a worker token cannot learn which
    digests exist; readers get NotFound for an absent one."""
    dataset = None
    try:
        dataset = get(db, digest)
    except NotFound:
        if principal.role != "worker" and principal.role in GRANTS["read"]:
            raise
    if dataset is None or not may_read(db, dataset, principal):
        raise Forbidden(f"this token may not read dataset {digest}")
    return dataset


def may_read(db: Session, dataset: Dataset, principal: Principal) -> bool:
    """Whether the caller may download the dataset: any reader, or a worker token one of
    whose workers holds a run that trains on it."""
    if principal.role != "worker":
        return principal.role in GRANTS["read"]
    held = db.scalar(
        select(func.count(Run.id))
        .join(Worker, Worker.id == Run.worker_id)
        .join(Experiment, Experiment.id == Run.experiment_id)
        .where(Run.status == "running", Worker.token_id == principal.token_id)
        .where(_uses(dataset.digest))
    )
    return bool(held)


def local_path(dataset: Dataset) -> Path:
    """The file behind the dataset's `file://` storage URL."""
    return Path(unquote(urlparse(dataset.storage_url).path))


def require_held(db: Session, digest: str | None) -> None:
    """InvalidSpec (422) naming the digest when a spec refers to a dataset not stored here."""
    if digest is None or find(db, digest) is not None:
        return
    msg = f"no dataset {digest} is stored on this server; push it first (repro dataset push)"
    raise InvalidSpec(msg, errors=[{"loc": "dataset.data", "msg": msg}])
