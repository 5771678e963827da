"""Tokens and roles on a real server: who may do what, and what every other caller gets."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.jobs import REPO
from tests.integration.service_procs import Service

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
ROLES = ("viewer", "submitter", "worker", "admin")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = Service(tmp_path_factory.mktemp("auth") / "data", extra=("--no-demo",))
    service.wait_ready()
    yield service
    service.stop()


@pytest.fixture(scope="module")
def world(api: Service) -> dict[str, Any]:
    """Clients of every role, a worker holding a run with an artifact, and a cancelled run."""
    clients = {role: api.client_for(role, f"the {role}") for role in ROLES}
    worker = clients["worker"].post("/api/v1/workers/register", json={"name": "w"}).json()
    held = api.submit(SEED001).json()
    claim = clients["worker"].post(f"/api/v1/workers/{worker['id']}/claim").json()
    assert claim["run"]["id"] == held["run"]["id"]
    data = b"checkpoint bytes"
    artifact = (
        clients["worker"]
        .post(
            f"/api/v1/runs/{held['run']['id']}/artifacts",
            params={
                "worker_id": worker["id"],
                "kind": "checkpoint",
                "name": "epoch-000001.npz",
                "epoch": 1,
            },
            content=data,
            headers={"X-Content-SHA256": hashlib.sha256(data).hexdigest()},
        )
        .json()
    )
    cancelled = api.submit(SEED001).json()["run"]["id"]
    api.client.post(f"/api/v1/runs/{cancelled}/cancel")
    spare = api.token("viewer", "spare")
    spare_id = next(
        t["id"] for t in api.client.get("/api/v1/tokens").json() if t["name"] == "spare"
    )
    assert spare
    return {
        "clients": clients,
        "worker_id": worker["id"],
        "run": held["run"]["id"],
        "experiment": held["experiment"]["id"],
        "artifact": artifact["id"],
        "cancelled": cancelled,
        "token_id": spare_id,
    }


def _operations(w: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(permission, method, path, request kwargs) for every protected operation."""
    run, wid = w["run"], w["worker_id"]
    report = {"json": {"worker_id": wid}}
    return [
        ("read", "GET", "/api/v1/experiments", {}),
        ("read", "GET", f"/api/v1/experiments/{w['experiment']}", {}),
        ("read", "GET", "/api/v1/runs", {}),
        ("read", "GET", f"/api/v1/runs/{run}", {}),
        ("read", "GET", f"/api/v1/runs/{w['cancelled']}/events", {}),
        (
            "submit",
            "POST",
            "/api/v1/experiments",
            {"content": SEED001, "headers": {"content-type": "application/yaml"}},
        ),
        ("submit", "POST", f"/api/v1/runs/{w['cancelled']}/rerun", {}),
        ("submit", "POST", f"/api/v1/runs/{w['cancelled']}/cancel", {}),
        ("work", "POST", "/api/v1/workers/register", {"json": {"name": "x"}}),
        ("work", "POST", f"/api/v1/workers/{wid}/claim", {}),
        ("work", "POST", f"/api/v1/runs/{run}/heartbeat", report),
        (
            "work",
            "POST",
            f"/api/v1/runs/{w['cancelled']}/fail",
            {"json": {"worker_id": wid, "error": {"type": "X", "message": "x"}}},
        ),
        ("work", "POST", f"/api/v1/runs/{w['cancelled']}/release", report),
        (
            "work",
            "POST",
            f"/api/v1/runs/{run}/artifacts",
            {
                "params": {"worker_id": wid, "kind": "checkpoint", "name": "x.npz"},
                "content": b"",
                "headers": {"X-Content-SHA256": hashlib.sha256(b"").hexdigest()},
            },
        ),
        ("admin", "GET", "/api/v1/tokens", {}),
        ("admin", "POST", "/api/v1/tokens", {"json": {"name": "n", "role": "viewer"}}),
        ("admin", "POST", f"/api/v1/tokens/{w['token_id']}/revoke", {}),
        ("admin", "GET", "/api/v1/audit", {}),
    ]


GRANTED = {
    "read": {"viewer", "submitter", "admin"},
    "submit": {"submitter", "admin"},
    "work": {"worker"},
    "admin": {"admin"},
}


@pytest.mark.parametrize("role", ROLES)
def test_each_role_is_denied_everything_outside_it(world: dict[str, Any], role: str) -> None:
    client: httpx.Client = world["clients"][role]
    for permission, method, path, kwargs in _operations(world):
        status = client.request(method, path, **kwargs).status_code
        if role in GRANTED[permission]:
            assert status not in (401, 403), (role, method, path, status)
        else:
            assert status == 403, (role, method, path, status)


def test_artifacts_are_readable_by_readers_and_the_holding_worker(
    world: dict[str, Any], api: Service
) -> None:
    path = f"/api/v1/artifacts/{world['artifact']}"
    for role in ("viewer", "submitter", "admin", "worker"):
        assert world["clients"][role].get(path).content == b"checkpoint bytes", role
    other = api.client_for("worker", "someone else")
    assert other.get(path).status_code == 403


def test_no_token_gets_401_everywhere_but_health(world: dict[str, Any], api: Service) -> None:
    with httpx.Client(base_url=api.url, timeout=30) as anonymous:
        for _, method, path, kwargs in _operations(world):
            response = anonymous.request(method, path, **kwargs)
            assert response.status_code == 401, (method, path)
            assert response.headers["www-authenticate"] == "Bearer"
        wrong = {"Authorization": "Bearer rpt_1_" + "x" * 43}
        assert anonymous.get("/api/v1/runs", headers=wrong).status_code == 401
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/readyz").status_code == 200


def test_revoked_and_expired_tokens_stop_working(api: Service) -> None:
    created = api.client.post(
        "/api/v1/tokens", json={"name": "short", "role": "viewer", "expires_in_days": 1.5e-5}
    ).json()
    revocable = api.client.post(
        "/api/v1/tokens", json={"name": "revoke me", "role": "viewer"}
    ).json()
    with httpx.Client(base_url=api.url, timeout=30) as c:

        def status(secret: str) -> int:
            return c.get("/api/v1/runs", headers={"Authorization": f"Bearer {secret}"}).status_code

        assert status(revocable["token"]) == 200
        api.client.post(f"/api/v1/tokens/{revocable['id']}/revoke")
        assert status(revocable["token"]) == 401
        time.sleep(1.5)  # 1.5e-5 days is 1.3 s
        response = c.get("/api/v1/runs", headers={"Authorization": f"Bearer {created['token']}"})
        assert response.status_code == 401 and "expired" in response.text


def test_tokens_are_stored_as_hashes_only(api: Service) -> None:
    import sqlite3

    secret = api.token("viewer", "hashed")
    with sqlite3.connect(api.data_dir / "reprotrain.db") as db:
        rows = db.execute("SELECT secret_hash FROM api_tokens").fetchall()
    assert all(secret not in row[0] for row in rows)
    assert (hashlib.sha256(secret.encode()).hexdigest(),) in rows


def test_audit_log_records_who_did_what(world: dict[str, Any], api: Service) -> None:
    submitter = world["clients"]["submitter"]
    run_id = submitter.post(
        "/api/v1/experiments", content=SEED001, headers={"content-type": "application/yaml"}
    ).json()["run"]["id"]
    submitter.post(f"/api/v1/runs/{run_id}/cancel")
    events = api.client.get("/api/v1/audit", params={"limit": 500}).json()["items"]
    mine = [
        (e["actor"], e["action"], e["target_id"]) for e in events if e["actor"] == "the submitter"
    ]
    assert ("the submitter", "run.cancel", run_id) in mine
    assert any(action == "experiment.submit" for _, action, _ in mine)
    assert any(e["action"] == "token.create" and e["actor"] == "local admin" for e in events)


def test_specs_beyond_the_operator_limits_are_refused(api: Service) -> None:
    too_long = SEED001.replace("epochs: 3", "epochs: 20000")
    response = api.submit(too_long)
    assert response.status_code == 422
    assert {
        "loc": "training.epochs",
        "msg": "20000 epochs exceeds this server's limit of 10000",
    } in response.json()["errors"]
    too_many = SEED001.replace("epochs: 3", "epochs: 100").replace(
        "train_batches: 7", "train_batches: 200000"
    )
    response = api.submit(too_many)
    assert response.status_code == 422 and "total steps" in response.text


def test_too_many_invalid_tokens_are_rate_limited(tmp_path: Path) -> None:
    service = Service(
        tmp_path / "data", extra=("--no-demo",), env={"REPRO_AUTH_FAILURES_ALLOWED": "5"}
    )
    service.wait_ready()
    try:
        with httpx.Client(base_url=service.url, timeout=30) as c:
            bad = {"Authorization": "Bearer rpt_1_" + "y" * 43}
            assert [c.get("/api/v1/runs", headers=bad).status_code for _ in range(5)] == [401] * 5
            limited = c.get("/api/v1/runs", headers=bad)
            assert limited.status_code == 429 and "too many invalid tokens" in limited.text
            assert 1 <= int(limited.headers["Retry-After"]) <= 61
            assert c.get("/healthz").status_code == 200
            # Token 1 is the admin's: someone else's bad guesses at it, from the same
            # address, never lock the real token out, nor other callers' first mistakes.
            admin = {"Authorization": f"Bearer {service.admin_token}"}
            assert service.admin_token.startswith("rpt_1_")
            assert c.get("/api/v1/runs", headers=admin).status_code == 200
            other = {"Authorization": "Bearer not-a-token"}
            assert c.get("/api/v1/runs", headers=other).status_code == 401
            assert c.get("/api/v1/runs").status_code == 401
            assert c.get("/api/v1/runs", headers=bad).status_code == 429
    finally:
        service.stop()


def test_the_last_admin_token_cannot_be_revoked(tmp_path: Path) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",))
    service.wait_ready()
    try:
        own = next(t for t in service.client.get("/api/v1/tokens").json() if t["role"] == "admin")
        refused = service.client.post(f"/api/v1/tokens/{own['id']}/revoke")
        assert refused.status_code == 409 and "last active admin" in refused.text
        service.token("admin", "second admin")
        assert service.client.post(f"/api/v1/tokens/{own['id']}/revoke").status_code == 200
    finally:
        service.stop()
