"""Code bundles by digest against a real `repro serve`, on SQLite and PostgreSQL: a wheel is
stored with its per-file manifest and entry points, bad wheels are refused with the reason
and nothing stored, specs name a bundle by digest, and a run with code waits, saying why,
while only workers that do not accept code are live."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.code_wheels import make_wheel, ring_bundle, ring_spec
from tests.integration.service_procs import Service, WorkerProc

MAX_FILES = 20


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def push(
    client: httpx.Client,
    body: bytes,
    *,
    name: str = "rings",
    filename: str = "ring_bundle-1.0-py3-none-any.whl",
) -> httpx.Response:
    return client.post(
        "/api/v1/code",
        params={"name": name, "filename": filename},
        content=body,
        headers={"Content-Type": "application/octet-stream", "X-Content-SHA256": sha256(body)},
    )


def pushed_digest(client: httpx.Client, body: bytes, *, name: str = "rings") -> str:
    """The digest of the wheel `body`, pushed (201) or already stored (200)."""
    answer = push(client, body, name=name)
    assert answer.status_code in (200, 201), answer.text
    return str(answer.json()["digest"])


@pytest.fixture(params=["sqlite", "postgresql"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    svc = Service(
        tmp_path / "data",
        database_url=url,
        env={"REPRO_MAX_CODE_BUNDLE_FILES": str(MAX_FILES), "REPRO_LEASE_SECONDS": "30"},
        extra=("--no-demo",),
    )
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


def stored_files(service: Service) -> list[Path]:
    root = service.data_dir / "artifacts" / "code"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_push_list_show(service: Service) -> None:
    body = ring_bundle()
    created = push(service.client, body)
    assert created.status_code == 201, created.text
    record = created.json()
    assert record["digest"] == sha256(body)
    assert {(e["group"], e["name"]) for e in record["entry_points"]} == {
        ("reprotrain.generators", "test_rings"),
        ("reprotrain.architectures", "test_ring_mlp"),
    }
    manifest = {f["path"]: f["sha256"] for f in record["files"]}
    assert (
        manifest["ring_bundle/model.py"]
        == hashlib.sha256(next(f for f in [ring_bundle_file("ring_bundle/model.py")])).hexdigest()
    )
    [stored] = stored_files(service)
    assert stored.read_bytes() == body and stored.stat().st_mode & 0o777 == 0o600
    assert push(service.client, body).status_code == 200  # content-addressed: stored once
    assert len(stored_files(service)) == 1
    viewer = service.client_for("viewer", "v")
    assert [b["digest"] for b in viewer.get("/api/v1/code").json()["items"]] == [record["digest"]]
    shown = viewer.get(f"/api/v1/code/{record['digest']}").json()
    assert shown["files"] == record["files"] and shown["runs"] == []
    assert viewer.get(f"/api/v1/code/{'0' * 64}").status_code == 404


def ring_bundle_file(path: str) -> bytes:
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(ring_bundle())) as zf:
        return zf.read(path)


REFUSED = {
    "not a zip": (b"PK\x03\x04 but not really a zip", "not a wheel"),
    "path traversal": (
        make_wheel({"../../escape.py": b"x = 1\n", "ring_bundle/__init__.py": b""}),
        "leaves the install directory",
    ),
    "absolute path": (make_wheel({"/etc/cron.d/x": b"x\n"}), "absolute"),
    "record mismatch": (
        make_wheel(
            {"ring_bundle/model.py": b"x = 1\n"},
            record_override={"ring_bundle/model.py": b"x = 2\n"},
        ),
        "does not match its RECORD digest",
    ),
    "unlisted file": (
        make_wheel({"ring_bundle/a.py": b""}, unlisted={"ring_bundle/hidden.py": b"x = 1\n"}),
        "not in its RECORD",
    ),
    "console script": (
        make_wheel(
            {"ring_bundle/a.py": b""}, entry_points="[console_scripts]\nevil = ring_bundle.a:f\n"
        ),
        "console_scripts",
    ),
    "no components": (make_wheel({"ring_bundle/a.py": b""}, entry_points=""), "no entry point"),
    # Layers have no group: a custom layer goes in the bundle's architecture.
    "only unknown groups": (
        make_wheel(
            {"ring_bundle/a.py": b""},
            entry_points="[reprotrain.layers]\nring = ring_bundle.a:Ring\n"
            "[reprotrain.metrics]\nhits = ring_bundle.a:hits\n",
        ),
        "groups 'reprotrain.layers', 'reprotrain.metrics' are not ones a bundle may declare",
    ),
    "metadata header lines": (
        make_wheel({"ring_bundle/a.py": b""}, metadata_headers=b"Classifier: x\n" * 1000),
        "METADATA's headers run past 1000 lines",
    ),
    "too many files": (
        make_wheel({f"ring_bundle/m{i}.py": b"" for i in range(MAX_FILES + 1)}),
        "REPRO_MAX_CODE_BUNDLE_FILES",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refusals_store_nothing(service: Service, case: str) -> None:
    body, reason = REFUSED[case]
    refused = push(service.client, body)
    assert refused.status_code == 422, refused.text
    assert reason in refused.json()["detail"] and "nothing was stored" in refused.json()["detail"]
    assert service.client.get("/api/v1/code").json()["total"] == 0
    assert stored_files(service) == []
    assert list((service.data_dir / "artifacts" / "code").glob(".upload-*")) == []


def test_spec_names_bundle_by_digest(service: Service, tmp_path: Path) -> None:
    unknown = "sha256:" + "ab" * 32
    refused = service.submit(ring_spec(unknown))
    assert refused.status_code == 422, refused.text
    assert unknown in refused.text and refused.json()["errors"][0]["loc"] == "code"
    assert service.client.get("/api/v1/runs").json()["items"] == []

    digest = pushed_digest(service.client, ring_bundle())
    created = service.submit(ring_spec(digest))
    assert created.status_code == 201, created.text
    run_id = created.json()["run"]["id"]
    experiment = created.json()["experiment"]
    # Without the bundle the same spec is another experiment: its digest is in the hash.
    other = pushed_digest(service.client, ring_bundle(hidden=5))
    assert (
        service.submit(ring_spec(other)).json()["experiment"]["spec_hash"]
        != (experiment["spec_hash"])
    )
    shown = service.client.get(f"/api/v1/code/{digest}").json()
    assert shown["runs"] == [run_id]

    # Only a process worker that does not accept code is live: the run waits, saying why.
    agent = WorkerProc(
        service.url, tmp_path / "w", token=service.token("worker", "plain"), name="plain"
    )
    try:
        agent.worker_id()
        time.sleep(2)  # it polls every 0.2 s: it would have claimed a run it could take
        run = service.client.get(f"/api/v1/runs/{run_id}").json()
        assert run["status"] == "queued"
        assert "no live worker accepts code" in run["waiting_reason"]
        assert "--trust-code" in run["waiting_reason"]
    finally:
        agent.stop()
    rerun = service.client.post(f"/api/v1/runs/{run_id}/rerun")
    assert rerun.status_code == 202, rerun.text


def test_switch_off_refuses_push_and_submit(tmp_path: Path) -> None:
    svc = Service(
        tmp_path / "data", env={"REPRO_ALLOW_CODE_BUNDLES": "false"}, extra=("--no-demo",)
    ).wait_ready()
    try:
        refused = push(svc.client, ring_bundle())
        assert refused.status_code == 422 and "REPRO_ALLOW_CODE_BUNDLES" in refused.text
        assert stored_files(svc) == []
        spec = svc.submit(ring_spec("sha256:" + "cd" * 32))
        assert spec.status_code == 422 and "REPRO_ALLOW_CODE_BUNDLES" in spec.text
    finally:
        svc.stop()
