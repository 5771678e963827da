"""Bytes in an S3-compatible store, against a real one (SeaweedFS): objects go in by digest
and the store refuses other bytes; a worker's presigned PUT takes only the bytes it was
signed for and nothing is recorded before the server has checked them; downloads redirect
to presigned GETs; the API keeps no copy. On SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import hashlib
import io
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.auth.tokens import Role
from service.config import Settings
from service.errors import DigestMismatch, NotFound
from service.persistence.migrate import upgrade
from service.storage import blob_store
from service.storage.s3_store import s3_store
from tests.integration.asgi_clients import Clients, with_clients
from tests.integration.jobs import REPO
from tests.integration.service_procs import Service, running
from tests.object_store import BUCKET, S3Server, S3Storage, s3_server, s3_storage

__all__ = ["s3_server", "s3_storage"]

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()


@pytest.fixture
def store_settings(
    s3_storage: S3Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    for name, value in s3_storage.env.items():
        monkeypatch.setenv(name, value)
    return Settings(
        data_dir=tmp_path / "data",
        storage_url=s3_storage.url,
        s3_endpoint_url=s3_storage.endpoint,
    )


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def keys_under(server: S3Server, prefix: str) -> list[str]:
    found = server.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(obj["Key"] for obj in found.get("Contents", []))


def test_bytes_go_in_by_digest_and_come_back_checked(
    store_settings: Settings, s3_server: S3Server
) -> None:
    store = s3_store(store_settings)
    store.check_bucket()
    body = b"checkpoint bytes " * 1000
    url = store.put_bytes("artifacts", sha(body), body)
    assert url == f"{store_settings.storage_url}/artifacts/{sha(body)[:2]}/{sha(body)}"
    assert blob_store.read_bytes(url, sha(body), settings=store_settings) == body
    # The store itself refuses bytes that are not the digest they are put under.
    with pytest.raises(DigestMismatch):
        store.put_bytes("artifacts", sha(body), b"other bytes")
    # Bytes changed in the store behind the server's back are not used.
    key = url.removeprefix(f"s3://{BUCKET}/")
    s3_server.client().put_object(Bucket=BUCKET, Key=key, Body=b"tampered")
    with pytest.raises(blob_store.StoredBytesUnreadable, match="SHA-256"):
        blob_store.read_bytes(url, sha(body), settings=store_settings)
    blob_store.delete(url, settings=store_settings)
    with pytest.raises(blob_store.StoredBytesUnreadable, match="missing"):
        blob_store.read_bytes(url, sha(body), settings=store_settings)
    blob_store.delete(url, settings=store_settings)  # gone already: nothing to do


def test_a_presigned_put_takes_only_the_bytes_it_was_signed_for(
    store_settings: Settings, s3_server: S3Server
) -> None:
    store = s3_store(store_settings)
    store.check_bucket()
    body = bytes(range(256)) * 64
    ticket = store.presigned_put(7, sha256=sha(body), size=len(body))
    assert (
        ticket.headers["x-amz-checksum-sha256"]
        == base64.b64encode(hashlib.sha256(body).digest()).decode()
    )
    with httpx.Client() as plain:
        same_length = plain.put(ticket.url, content=bytes(len(body)), headers=ticket.headers)
        assert same_length.status_code == 400 and "BadDigest" in same_length.text
        longer = {**ticket.headers, "Content-Length": str(len(body) + 1)}
        assert plain.put(ticket.url, content=body + b"!", headers=longer).status_code == 403
        with pytest.raises(NotFound):  # nothing staged yet
            store.adopt(7, ticket.upload_id, space="artifacts", sha256=sha(body), size=len(body))
        assert plain.put(ticket.url, content=body, headers=ticket.headers).status_code == 200
    # Another run's id does not reach this run's staged upload.
    with pytest.raises(NotFound):
        store.adopt(8, ticket.upload_id, space="artifacts", sha256=sha(body), size=len(body))
    url = store.adopt(7, ticket.upload_id, space="artifacts", sha256=sha(body), size=len(body))
    assert blob_store.read_bytes(url, sha(body), settings=store_settings) == body
    staged_prefix = f"{store.prefix}/uploads/"
    assert keys_under(s3_server, staged_prefix) == []  # adopted: the staging object went

    # A store that kept no checksum (or a declared size that is not the upload's) is caught by
    # the server's own check, and the staged bytes go.
    again = store.presigned_put(7, sha256=sha(body), size=len(body))
    with httpx.Client() as plain:
        assert plain.put(again.url, content=body, headers=again.headers).status_code == 200
    with pytest.raises(DigestMismatch, match="bytes, not the declared"):
        store.adopt(7, again.upload_id, space="artifacts", sha256=sha(body), size=len(body) - 1)
    assert keys_under(s3_server, staged_prefix) == []

    # Uploads a worker staged and never reported are swept.
    late = store.presigned_put(9, sha256=sha(body), size=len(body))
    with httpx.Client() as plain:
        assert plain.put(late.url, content=body, headers=late.headers).status_code == 200
    import datetime as dt

    assert store.sweep_staged(older_than=dt.timedelta(hours=1)) == 0
    assert store.sweep_staged(older_than=dt.timedelta(0)) == 1
    assert keys_under(s3_server, staged_prefix) == []


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **arrays)
    return buf.getvalue()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_the_api_keeps_bytes_in_the_store_and_workers_bypass_it(
    database: str,
    store_settings: Settings,
    s3_server: S3Server,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    url = request.getfixturevalue("postgres_url") if database == "postgresql" else ""
    settings = store_settings.model_copy(update={"database_url": url})
    # The app's own settings name the store, whatever the process-wide ones say (a server
    # started with command-line settings, or an earlier test's in this process).
    elsewhere = Settings(data_dir=tmp_path / "other", storage_url="", s3_endpoint_url=None)
    monkeypatch.setattr("service.storage.s3_store.get_settings", lambda: elsewhere)
    upgrade(settings.resolved_database_url)
    roles: dict[str, Role] = {"admin": "admin", "worker": "worker"}
    prefix = settings.storage_url.removeprefix(f"s3://{BUCKET}/")

    async def body(app: object, clients: Clients) -> None:
        admin, worker = clients["admin"], clients["worker"]
        # A dataset pushed by a user goes to the store, under its digest.
        data = _npz(x=np.arange(40, dtype=np.float32).reshape(10, 4), y=np.arange(10) % 2)
        pushed = await admin.post(
            "/api/v1/datasets",
            content=data,
            params={"name": "tiny"},
            headers={"X-Content-SHA256": sha(data)},
        )
        assert pushed.status_code == 201, pushed.text
        assert keys_under(s3_server, f"{prefix}/datasets/") == [
            f"{prefix}/datasets/{sha(data)[:2]}/{sha(data)}"
        ]
        # Its download is a redirect to a presigned GET that needs no token.
        content = await admin.get(f"/api/v1/datasets/sha256:{sha(data)}/content")
        assert content.status_code == 307
        assert content.headers["x-content-sha256"] == f"sha256:{sha(data)}"
        location = content.headers["location"]
        assert location.startswith(s3_server.endpoint) and "X-Amz-Signature" in location
        with httpx.Client() as plain:
            fetched = plain.get(location)
        assert fetched.status_code == 200 and sha(fetched.content) == sha(data)

        # A worker learns at registration that its files go to the store directly.
        registered = await worker.post("/api/v1/workers/register", json={"name": "w"})
        assert registered.json()["presigned_uploads"] is True
        worker_id = registered.json()["id"]
        created = await admin.post(
            "/api/v1/experiments",
            content=SEED001,
            headers={"Content-Type": "application/yaml"},
        )
        assert created.status_code == 201, created.text
        claimed = await worker.post(f"/api/v1/workers/{worker_id}/claim")
        assert claimed.status_code == 200, claimed.text
        run_id, attempt = claimed.json()["run"]["id"], claimed.json()["run"]["attempt"]
        npz = _npz(w=np.ones((3, 3), dtype=np.float32))
        fields = {
            "worker_id": worker_id,
            "attempt": attempt,
            "kind": "checkpoint",
            "name": "epoch-000001.npz",
            "epoch": 1,
            "sha256": sha(npz),
            "size": len(npz),
        }
        uploads = f"/api/v1/runs/{run_id}/artifact-uploads"
        ticket = await worker.post(uploads, json=fields)
        assert ticket.status_code == 201, ticket.text
        ticket_body = ticket.json()
        assert "Authorization" not in ticket_body["headers"]
        # Other bytes under the ticket: the store refuses them; nothing is recorded.
        with httpx.Client() as plain:
            forged = plain.put(
                ticket_body["url"], content=bytes(len(npz)), headers=ticket_body["headers"]
            )
        assert forged.status_code == 400
        missing = await worker.post(f"{uploads}/{ticket_body['upload_id']}", json=fields)
        assert missing.status_code == 404, missing.text
        # The signed bytes go straight to the store, then the report records them.
        with httpx.Client() as plain:
            put = plain.put(ticket_body["url"], content=npz, headers=ticket_body["headers"])
        assert put.status_code == 200, put.text
        done = await worker.post(f"{uploads}/{ticket_body['upload_id']}", json=fields)
        assert done.status_code == 200, done.text
        assert done.json()["sha256"] == sha(npz) and done.json()["size"] == len(npz)
        # A report for an upload already recorded (or never made) records nothing more.
        twice = await worker.post(f"{uploads}/{ticket_body['upload_id']}", json=fields)
        assert twice.status_code == 404
        # A declared size past the run's bounds is refused before any byte moves.
        huge = await worker.post(uploads, json={**fields, "name": "big.npz", "size": 2**40})
        assert huge.status_code == 413, huge.text
        # The worker's download of its checkpoint is a presigned GET too.
        got = await worker.get(f"/api/v1/artifacts/{done.json()['id']}")
        assert got.status_code == 307
        with httpx.Client() as plain:
            assert sha(plain.get(got.headers["location"]).content) == sha(npz)
        stored = keys_under(s3_server, f"{prefix}/artifacts/")
        assert stored == [f"{prefix}/artifacts/{sha(npz)[:2]}/{sha(npz)}"]

    with_clients(settings, roles, body)
    # The API process kept no copy of any of it.
    local = settings.resolved_artifacts_dir
    kept = [p for p in local.rglob("*") if p.is_file()] if local.exists() else []
    assert kept == []


def test_a_server_without_an_object_store_says_where_bytes_go(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    upgrade(settings.resolved_database_url)

    async def body(app: object, clients: Clients) -> None:
        worker = clients["worker"]
        registered = await worker.post("/api/v1/workers/register", json={"name": "w"})
        assert registered.json()["presigned_uploads"] is False
        ticket = await worker.post(
            "/api/v1/runs/1/artifact-uploads",
            json={
                "worker_id": registered.json()["id"],
                "kind": "checkpoint",
                "name": "a.npz",
                "sha256": "0" * 64,
                "size": 1,
            },
        )
        assert ticket.status_code == 409
        assert "/api/v1/runs/1/artifacts" in ticket.json()["detail"]

    with_clients(settings, {"worker": "worker"}, body)


def test_a_run_trains_with_its_files_in_the_store_and_reruns_identical(
    s3_storage: S3Storage, s3_server: S3Server, tmp_path: Path
) -> None:
    service = Service(tmp_path / "data", env=s3_storage.env, extra=("--no-demo",))
    with running(service, tmp_path / "worker") as (svc, (agent,)):
        created = svc.submit(SEED001)
        assert created.status_code == 201, created.text
        run = svc.wait_run(created.json()["run"]["id"])
        assert run["status"] == "succeeded", run["error"]
        # The server checked the final checkpoint it read back from the store.
        assert run["reported_by"]["fingerprint"]["outcome"] == "verified"
        rerun = svc.client.post(f"/api/v1/runs/{run['id']}/rerun")
        second = svc.wait_run(rerun.json()["id"])
        assert second["verdict"] == "identical", second["verdict_report"]
        arts = svc.client.get(f"/api/v1/runs/{run['id']}/artifacts").json()
        agent_log = agent.log.read_text()
    assert "files go to the object store by presigned URL" in agent_log
    prefix = s3_storage.url.removeprefix(f"s3://{BUCKET}/")
    stored = set(keys_under(s3_server, f"{prefix}/artifacts/"))
    assert {a["name"] for a in arts} >= {"epoch-000003.npz", "epoch-000003.json"}
    for art in arts:
        assert f"{prefix}/artifacts/{art['sha256'][:2]}/{art['sha256']}" in stored
    # Every checkpoint went around the API: its data directory holds none of them.
    local = tmp_path / "data" / "artifacts"
    assert not local.exists() or not [p for p in local.rglob("*") if p.is_file()]


def test_people_get_the_public_address_and_workers_the_inner_one(
    store_settings: Settings,
) -> None:
    public = store_settings.model_copy(
        update={"s3_public_endpoint_url": "https://store.example.org"}
    )
    store = s3_store(public)
    url = f"{public.storage_url}/artifacts/ab/{'ab' * 32}"
    for_people = store.presigned_get(url, filename="a.npz", for_worker=False)
    for_workers = store.presigned_get(url, filename="a.npz", for_worker=True)
    assert for_people.startswith("https://store.example.org/")
    assert for_workers.startswith(f"{public.s3_endpoint_url}/")
    # Uploads are only ever a worker's.
    ticket = store.presigned_put(1, sha256="ab" * 32, size=3)
    assert ticket.url.startswith(f"{public.s3_endpoint_url}/")
