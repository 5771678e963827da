"""Datasets pushed by digest: streamed in, verified, inspected, stored content-addressed.

A dataset file is spooled to a temporary file beside the store while its SHA-256 is
computed, so memory stays bounded whatever its size. Only when the digest matches the
client's and the dataset reader accepts every byte of it is it renamed to its digest and
recorded; any refusal leaves neither a file nor a row behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session

from service.auth.tokens import Principal
from service.errors import DatasetRefused, InvalidSpec
from service.persistence.models import Dataset, Experiment
from service.storage.blob_store import BlobStore
from service.storage.by_digest import ByDigest
from worker.data.dataset_format import (
    ArrayInfo,
    DatasetFormatError,
    DatasetInfo,
    DatasetTooLarge,
    inspect_dataset,
)
from worker.errors import SpecError
from worker.models.data_fit import check_data_fit
from worker.spec import ExperimentSpec


def _uses(digest: str) -> ColumnElement[bool]:
    # JSON path comparison: json_extract on SQLite, ->> on PostgreSQL.
    uses: ColumnElement[bool] = Experiment.spec["dataset"]["data"].as_string() == digest
    return uses


STORE = ByDigest(
    Dataset, _uses, noun="dataset", target_type="dataset", action="dataset.push", command="dataset"
)
find = STORE.find
get = STORE.get


def store(
    *,
    db: Session,
    spooled: Path,
    size: int,
    digest: str,
    name: str,
    store: BlobStore,
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
            return STORE.again(
                db, existing, put=lambda: store.put_file("datasets", digest, spooled), actor=actor
            )
        try:
            info = inspect_dataset(spooled, max_bytes=max_inflated_bytes, label=repr(name))
        except DatasetTooLarge as exc:
            msg = f"{exc} (REPRO_MAX_DATASET_INFLATED_BYTES); nothing was stored"
            raise DatasetRefused(f"not a dataset this service accepts: {msg}") from None
        except DatasetFormatError as exc:
            raise DatasetRefused(f"not a dataset this service accepts: {exc}") from None
        url = store.put_file("datasets", digest, spooled)
        dataset = Dataset(
            digest=digest,
            name=name,
            size=size,
            format=info.format,
            samples=info.samples,
            arrays=[_array_record(a) for a in info.arrays],
            storage_url=url,
            pushed_by_id=actor.token_id,
            pushed_by=actor.name,
        )
        details = {"digest": digest, "name": name, "size": size}
        return STORE.keep(db, dataset, actor=actor, details=details)
    finally:
        spooled.unlink(missing_ok=True)


def _array_record(array: ArrayInfo) -> dict[str, Any]:
    record: dict[str, Any] = {"name": array.name, "shape": list(array.shape), "dtype": array.dtype}
    if array.low is not None and array.high is not None:
        record.update(low=array.low, high=array.high)  # integer arrays: checked at submit
    return record


def described(db: Session, digest: str | None) -> DatasetInfo | None:
    """What the stored dataset of `digest` holds, as its record says; None when none is named
    or stored. Datasets pushed before value ranges were recorded have none."""
    dataset = find(db, digest) if digest is not None else None
    if dataset is None:
        return None
    arrays = tuple(
        ArrayInfo(a["name"], tuple(a["shape"]), a["dtype"], a.get("low"), a.get("high"))
        for a in dataset.arrays
    )
    return DatasetInfo(dataset.format, arrays, dataset.samples)


def require_fit(db: Session, spec: ExperimentSpec) -> None:
    """InvalidSpec (422) with the reason when the spec's data cannot feed its model or serve
    its batches, judged from the stored dataset's record (see worker.models.data_fit)."""
    try:
        check_data_fit(spec, described(db, spec.dataset.data))
    except SpecError as exc:
        raise InvalidSpec(str(exc), errors=exc.errors) from None


def require_held(db: Session, digest: str | None, *, new: bool = True) -> None:
    """InvalidSpec (422) naming the digest when a spec refers to a dataset not stored here,
    or whose bytes retention removed; for a new experiment (`new`), an archived one too."""
    if digest is not None:
        STORE.require(db, digest, loc="dataset.data", new=new)
