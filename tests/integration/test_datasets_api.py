"""Datasets by digest against a real `repro serve` process, on SQLite and PostgreSQL: push,
list, show, download; bad uploads refused with the reason and nothing stored; specs that
name a dataset the server does not hold refused at submit and rerun."""

from __future__ import annotations

import hashlib
import io
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.cli_runner import repro
from tests.integration.service_procs import Service

MAX_DATASET_BYTES = 256 * 1024  # small, so the too-large case is cheap
# A small CNN on a stored dataset of 8x8 images: a quarter held out, flips as augmentation.
ARRAYS_SPEC: dict[str, Any] = yaml.safe_load(
    """
name: stored-digits
seed: 7
dataset:
  generator: arrays
  params: {num_classes: 10, eval_fraction: 0.25, flip_left_right: true, scale: 0.0625}
  batch_size: 8
  train_batches: 3
  eval_batches: 1
model:
  architecture: small_cnn
  params: {filters: [4], dropout: 0.0, dense: 8}
training:
  epochs: 2
  optimizer: {name: adam, params: {learning_rate: 0.01}}
  loss: {name: sparse_categorical_crossentropy, params: {from_logits: true}}
  metrics: [accuracy]
"""
)


def npz_bytes(compressed: bool = False, **arrays: Any) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digits_like(n: int = 40, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 16, size=(n, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, size=(n,)).astype(np.int64)
    return npz_bytes(x=x, y=y)


def push(
    client: httpx.Client, body: bytes, *, name: str = "digits", digest: str | None = None
) -> httpx.Response:
    return client.post(
        "/api/v1/datasets",
        params={"name": name},
        content=body,
        headers={
            "Content-Type": "application/octet-stream",
            "X-Content-SHA256": digest or sha256(body),
        },
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    svc = Service(
        tmp_path / "data",
        database_url=url,
        env={"REPRO_MAX_DATASET_BYTES": str(MAX_DATASET_BYTES)},
        extra=("--no-demo",),
    )
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


def stored_files(service: Service) -> list[Path]:
    root = service.data_dir / "artifacts" / "datasets"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def spec_using(digest: str) -> str:
    """The JSON text of the arrays spec, training on the dataset of `digest`."""
    spec = json.loads(json.dumps(ARRAYS_SPEC))
    spec["dataset"]["data"] = digest
    return json.dumps(spec)


def test_push_list_show_download(service: Service) -> None:
    body = digits_like()
    first = push(service.client, body)
    assert first.status_code == 201, first.text
    record = first.json()
    digest = sha256(body)
    assert record["digest"] == digest
    assert record["name"] == "digits"
    assert record["size"] == len(body)
    assert record["format"] == "npz"
    assert record["samples"] == 40
    assert record["arrays"] == [
        {"name": "x", "shape": [40, 8, 8, 1], "dtype": "float32"},
        {"name": "y", "shape": [40], "dtype": "int64"},
    ]
    admin = {t["id"]: t["name"] for t in service.client.get("/api/v1/tokens").json()}
    assert record["pushed_by"] in admin.values()  # the name of the token that pushed it
    # Stored once, named by digest, owner-only.
    [stored] = stored_files(service)
    assert stored.name == digest.removeprefix("sha256:")
    assert stored.stat().st_mode & 0o777 == 0o600
    assert stored.read_bytes() == body

    # The same bytes again (another name, a submitter's token): the same record, 200.
    submitter = service.client_for("submitter", "alice")
    again = push(submitter, body, name="other name")
    assert again.status_code == 200, again.text
    assert again.json()["digest"] == digest and again.json()["name"] == "digits"
    assert again.json()["pushed_by"] == record["pushed_by"]
    assert len(stored_files(service)) == 1

    viewer = service.client_for("viewer", "bob")
    listed = viewer.get("/api/v1/datasets").json()
    assert listed["total"] == 1 and [d["digest"] for d in listed["items"]] == [digest]
    shown = viewer.get(f"/api/v1/datasets/{digest}")
    assert shown.status_code == 200 and shown.json()["arrays"] == record["arrays"]
    bare = viewer.get(f"/api/v1/datasets/{digest.removeprefix('sha256:')}")
    assert bare.status_code == 200 and bare.json()["digest"] == digest
    download = viewer.get(shown.json()["content_url"])
    assert download.status_code == 200
    assert download.content == body
    assert download.headers["x-content-sha256"] == digest

    # Viewers read but do not push; a worker token reads only datasets of runs it holds.
    assert push(viewer, digits_like(seed=1)).status_code == 403
    worker = service.client_for("worker", "w1")
    assert worker.get(f"/api/v1/datasets/{digest}/content").status_code == 403
    missing = "sha256:" + "0" * 64
    assert viewer.get(f"/api/v1/datasets/{missing}").status_code == 404
    assert viewer.get("/api/v1/datasets/not-a-digest").status_code == 422


def test_a_spec_naming_an_unknown_dataset_is_refused_and_a_known_one_lists_its_runs(
    service: Service,
) -> None:
    body = digits_like(seed=3)
    digest = sha256(body)
    refused = service.submit(spec_using(digest), content_type="application/json")
    assert refused.status_code == 422, refused.text
    assert digest in refused.json()["detail"]
    assert refused.json()["errors"][0]["loc"] == "dataset.data"
    assert service.client.get("/api/v1/experiments").json()["total"] == 0

    assert push(service.client, body).status_code == 201
    accepted = service.submit(spec_using(digest), content_type="application/json")
    assert accepted.status_code == 201, accepted.text
    run_id = accepted.json()["run"]["id"]
    assert accepted.json()["experiment"]["spec"]["dataset"]["data"] == digest
    rerun = service.client.post(f"/api/v1/runs/{run_id}/rerun")
    assert rerun.status_code == 202, rerun.text
    shown = service.client.get(f"/api/v1/datasets/{digest}").json()
    assert shown["runs"] == [rerun.json()["id"], run_id]
    assert shown["runs_total"] == 2


def _object_dtype() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, x=np.array([{"a": 1}, None], dtype=object), y=np.zeros(2))
    return buf.getvalue()


BAD_UPLOADS: dict[str, tuple[bytes, int, str]] = {
    "not a zip": (b"hello, this is not a dataset" * 10, 422, "not a dataset"),
    "truncated": (digits_like()[:-200], 422, "dataset"),
    "mismatched first dimensions": (
        npz_bytes(x=np.zeros((10, 4), np.float32), y=np.zeros(9, np.int64)),
        422,
        "rows",
    ),
    "object dtype": (_object_dtype(), 422, "object"),
    "too large": (npz_bytes(x=np.zeros((MAX_DATASET_BYTES // 4 + 10,), np.float32)), 413, ""),
}


@pytest.mark.parametrize("case", sorted(BAD_UPLOADS))
def test_bad_uploads_are_refused_with_the_reason_and_nothing_is_stored(
    service: Service, case: str
) -> None:
    body, status, reason = BAD_UPLOADS[case]
    answer = push(service.client, body)
    assert answer.status_code == status, answer.text
    assert reason in answer.json()["detail"]
    assert service.client.get("/api/v1/datasets").json()["total"] == 0
    assert stored_files(service) == []


def test_a_digest_that_does_not_match_the_bytes_stores_nothing(service: Service) -> None:
    body = digits_like()
    claimed = sha256(b"something else")
    answer = push(service.client, body, digest=claimed)
    assert answer.status_code == 400, answer.text
    detail = answer.json()["detail"]
    assert claimed in detail and sha256(body) in detail
    assert service.client.get("/api/v1/datasets").json()["total"] == 0
    assert stored_files(service) == []
    # A malformed digest header is refused before the body is read.
    assert push(service.client, body, digest="md5:abc").status_code == 422


def _repro(service: Service, *args: str) -> subprocess.CompletedProcess[str]:
    """`repro ARGS` against `service`, as its admin (the token from the environment)."""
    return repro(*args, "--api", service.url, env={"REPRO_TOKEN": service.admin_token}, timeout=120)


@pytest.mark.parametrize("service", ["sqlite"], indirect=True)
def test_repro_dataset_push_list_show(service: Service, tmp_path: Path) -> None:
    body = digits_like(seed=9)
    path = tmp_path / "digits.npz"
    path.write_bytes(body)
    pushed = _repro(service, "dataset", "push", str(path), "--name", "eight by eight")
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout.strip() == sha256(body)  # the digest alone, for `dataset.data`
    again = _repro(service, "dataset", "push", str(path))
    assert again.returncode == 0 and again.stdout.strip() == sha256(body)

    listed = _repro(service, "dataset", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [d["name"] for d in json.loads(listed.stdout)["items"]] == ["eight by eight"]
    shown = _repro(service, "dataset", "show", sha256(body))
    assert shown.returncode == 0, shown.stderr
    assert "x: float32 (40, 8, 8, 1)" in shown.stdout and "runs       none" in shown.stdout

    path.write_bytes(body[:-100])  # truncated: refused, exit 2, the reason on stderr
    refused = _repro(service, "dataset", "push", str(path))
    assert refused.returncode == 2
    assert "422" in refused.stderr and "not a dataset this service accepts" in refused.stderr
    missing = _repro(service, "dataset", "show", "sha256:" + "1" * 64)
    assert missing.returncode == 2 and "404" in missing.stderr


@pytest.mark.parametrize("service", ["sqlite"], indirect=True)
def test_a_push_cut_off_midway_leaves_no_file_behind(service: Service) -> None:
    body = digits_like(n=400)
    head = (
        f"POST /api/v1/datasets?name=cut HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {service.admin_token}\r\n"
        f"Content-Type: application/octet-stream\r\nX-Content-SHA256: {sha256(body)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", service.port), timeout=30) as conn:
        conn.sendall(head + body[: len(body) // 2])
        spool = service.data_dir / "artifacts" / "datasets"
        for _ in range(200):  # the server has started spooling the upload
            if spool.is_dir() and any(spool.iterdir()):
                break
            time.sleep(0.05)
        assert [p.name.startswith(".upload-") for p in spool.iterdir()] == [True]
    for _ in range(200):  # the connection is gone: so is the partial file
        if not any(spool.iterdir()):
            break
        time.sleep(0.05)
    assert list(spool.iterdir()) == []
    assert service.client.get("/api/v1/datasets").json()["total"] == 0
