"""Datasets that inflate, and what a push or a download gives away, against a real `repro
serve` on SQLite and PostgreSQL: a compressed push declaring more than the inflated bound is
refused from its headers with nothing stored; a worker refuses to start a job on a dataset
larger than the memory it has; a worker token cannot tell an absent digest from one it may
not read; refusals name the upload, not the server's files."""

from __future__ import annotations

import io
import struct
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.integration.service_procs import Service
from tests.integration.test_datasets_api import (
    digits_like,
    npz_bytes,
    push,
    sha256,
    spec_using,
    stored_files,
)

MAX_INFLATED = 32 * 2**20


@pytest.fixture
def service(database_url: str | None, tmp_path: Path) -> Iterator[Service]:
    svc = Service(
        tmp_path / "data",
        database_url=database_url,
        env={"REPRO_MAX_DATASET_INFLATED_BYTES": str(MAX_INFLATED)},
        extra=("--no-demo",),
    )
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


def declaring(rows: int) -> bytes:
    """A few KB of npz whose one float32 array declares `rows` rows: the zip's sizes say so,
    its deflated bytes hold only the first few (what a hostile client sends)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (rows,)}
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", header.getvalue() + bytes(4096))
    data = bytearray(buf.getvalue())
    declared = struct.pack("<I", len(header.getvalue()) + 4 * rows)
    data[22:26] = declared  # the local header's uncompressed size
    central = data.rfind(b"PK\x01\x02")
    data[central + 24 : central + 28] = declared  # the central directory's
    return bytes(data)


def test_a_compressed_push_declaring_more_than_the_bound_is_refused_before_inflating(
    service: Service,
) -> None:
    # 128 MiB of zeros in about 130 KB, and 3 GiB declared in a few KB.
    real = npz_bytes(compressed=True, x=np.zeros(MAX_INFLATED, np.float32))
    assert len(real) < 1_000_000
    for body, declared in ((real, 4 * MAX_INFLATED), (declaring(3 * 2**28), 3 * 2**30)):
        started = time.monotonic()
        answer = push(service.client, body, name="zeros")
        assert answer.status_code == 422, answer.text
        assert time.monotonic() - started < 30  # headers only: nothing is inflated
        detail = answer.json()["detail"]
        assert "REPRO_MAX_DATASET_INFLATED_BYTES" in detail
        assert str(MAX_INFLATED) in detail and str(declared) in detail
        assert "'zeros'" in detail
    assert service.client.get("/api/v1/datasets").json()["total"] == 0
    assert stored_files(service) == []
    # Within the bound, compressed is fine.
    fits = npz_bytes(compressed=True, x=np.zeros((1000, 8), np.float32), y=np.zeros(1000))
    assert push(service.client, fits).status_code == 201


def test_a_refusal_names_the_upload_not_the_spooled_file(service: Service) -> None:
    for body in (digits_like()[:-200], b"not a dataset at all" * 10):
        answer = push(service.client, body, name="my digits")
        assert answer.status_code == 422, answer.text
        detail = answer.json()["detail"]
        assert "'my digits'" in detail
        assert ".upload-" not in detail and ".part" not in detail
        assert str(service.data_dir) not in detail
    assert stored_files(service) == []


def test_a_worker_token_cannot_tell_an_absent_dataset_from_one_it_may_not_read(
    service: Service,
) -> None:
    body = digits_like(seed=4)
    assert push(service.client, body).status_code == 201
    stored, absent = sha256(body), "sha256:" + "0" * 64
    worker = service.client_for("worker", "curious")
    answers = [worker.get(f"/api/v1/datasets/{d}/content") for d in (stored, absent)]
    assert [a.status_code for a in answers] == [403, 403]
    assert answers[0].json()["detail"].replace(stored, absent) == answers[1].json()["detail"]
    # A reader may read any dataset, so it is told which ones are absent.
    viewer = service.client_for("viewer", "reader")
    assert viewer.get(f"/api/v1/datasets/{absent}/content").status_code == 404
    assert viewer.get(f"/api/v1/datasets/{stored}/content").status_code == 200


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_worker_fails_a_run_whose_dataset_exceeds_its_memory_before_the_job_starts(
    service: Service, tmp_path: Path
) -> None:
    rows = 8192  # x: 8192 x 8 x 8 x 1 float32, 2 MiB inflated, a few KB compressed
    body = npz_bytes(
        compressed=True, x=np.zeros((rows, 8, 8, 1), np.float32), y=np.zeros(rows, np.int64)
    )
    assert push(service.client, body).status_code == 201
    submitted = service.submit(spec_using(sha256(body)), content_type="application/json")
    assert submitted.status_code == 201, submitted.text
    run_id = submitted.json()["run"]["id"]
    worker = service.worker(tmp_path / "small-node", env={"REPRO_WORKER_JOB_MEMORY": "1m"})
    try:
        run = service.wait_run(run_id, timeout=120)
    finally:
        worker.stop()
    assert run["status"] == "failed", run
    error = run["error"]
    assert error["type"] == "DatasetTooLarge", error
    needed = rows * 64 * 4 + rows * 8
    assert str(needed) in error["message"] and str(2**20) in error["message"]
    assert "REPRO_WORKER_JOB_MEMORY" in error["message"]
    assert run["attempt"] == 1  # failed once, for good: not requeued to fail again
