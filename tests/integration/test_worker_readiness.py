"""Workers report what the reproducibility checks flagged where they run jobs, against a real
`repro serve` on SQLite and PostgreSQL: the flags are bounded, stored with the registration,
listed by `GET /workers` and shown on the workers page; a real agent runs the checks."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from service.persistence.engine import make_engine
from service.persistence.migrate import upgrade
from tests.integration.service_procs import Service

FLAGS_PER_WORKER = 2
THREADS = {
    "check": "threads",
    "message": "thread counts left to the machine (OMP_NUM_THREADS unset)",
}


@pytest.fixture
def service(database_url: str | None, tmp_path: Path) -> Iterator[Service]:
    svc = Service(
        tmp_path / "data",
        database_url=database_url,
        env={"REPRO_MAX_WORKER_FLAGS": str(FLAGS_PER_WORKER)},
        extra=("--no-demo",),
    )
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


def _register(client: httpx.Client, name: str, **fields: Any) -> httpx.Response:
    return client.post("/api/v1/workers/register", json={"name": name, **fields})


def _workers(service: Service) -> dict[str, dict[str, Any]]:
    answer = service.client.get("/api/v1/workers")
    assert answer.status_code == 200, answer.text
    return {w["name"]: w for w in answer.json()}


@pytest.mark.parametrize(
    ("flags", "loc"),
    [
        ([THREADS] * (FLAGS_PER_WORKER + 1), "body.readiness_flags"),
        ([{"check": "tf32", "message": "m" * 1001}], "body.readiness_flags.0.message"),
        ([{"check": "c" * 41, "message": "m"}], "body.readiness_flags.0.check"),
        ([{"check": "tf32"}], "body.readiness_flags.0.message"),
    ],
    ids=["too many", "long message", "long check", "no message"],
)
def test_bad_flags_get_422_naming_the_field_and_store_nothing(
    service: Service, flags: list[dict[str, str]], loc: str
) -> None:
    client = service.client_for("worker", "node")
    answer = _register(client, "gpu-node", readiness_flags=flags)
    assert answer.status_code == 422, answer.text
    assert loc in [e["loc"] for e in answer.json()["errors"]], answer.json()
    assert _workers(service) == {}


def test_flags_are_stored_listed_and_shown_and_absent_ones_say_not_checked(
    service: Service,
) -> None:
    client = service.client_for("worker", "node")
    tf32 = {"check": "tf32", "message": "TF32 is on on a GPU of compute capability 8.0"}
    assert _register(client, "a100", readiness_flags=[tf32, THREADS]).status_code == 201
    assert _register(client, "clean", readiness_flags=[]).status_code == 201
    assert _register(client, "old-agent").status_code == 201
    workers = _workers(service)
    assert workers["a100"]["readiness_flags"] == [tf32, THREADS]
    assert workers["clean"]["readiness_flags"] == []
    assert workers["old-agent"]["readiness_flags"] is None
    # Registering again refreshes them.
    assert _register(client, "a100", readiness_flags=[THREADS]).status_code == 201
    assert _workers(service)["a100"]["readiness_flags"] == [THREADS]
    page = service.dashboard().get("/workers")
    assert page.status_code == 200
    rows = {
        name: row
        for row in re.findall(r"<tr>.*?</tr>", page.text, re.S)
        for name in ("a100", "clean", "old-agent")
        if f">{name}</a>" in row
    }
    assert "threads: thread counts left to the machine" in rows["a100"]
    assert "tf32" not in rows["a100"]
    assert "nothing flagged" in rows["clean"]
    assert "not checked" in rows["old-agent"]


@pytest.mark.slow
def test_a_worker_runs_the_checks_and_reports_their_flags(service: Service, tmp_path: Path) -> None:
    agent = service.worker(
        tmp_path / "checked-node", env={"TF_DETERMINISTIC_OPS": "0"}, readiness_checks=True
    )
    try:
        agent.worker_id()
        deadline = time.monotonic() + 180
        flags = None
        while time.monotonic() < deadline and flags is None:
            flags = _workers(service)["checked-node"]["readiness_flags"]
            time.sleep(0.5)
        assert flags is not None, agent.log.read_text()
        assert any(
            f["check"] == "op_determinism" and "TF_DETERMINISTIC_OPS=0" in f["message"]
            for f in flags
        ), flags
    finally:
        agent.stop()


def test_the_migration_adds_the_flags_to_workers_registered_before_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'before.db'}"
    upgrade(url, "0010")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO workers (id, name, hostname, executors, images, gpus, devices, "
                    "accepts_code, registered_at, last_seen_at) VALUES (1, 'old', 'h', :ex, "
                    "'[]', 0, 1, 0, '2026-01-01', '2026-01-01')"
                ),
                {"ex": json.dumps(["process"])},
            )
        upgrade(url)
        with engine.connect() as conn:
            found = conn.execute(sa.text("SELECT name, readiness_flags FROM workers")).all()
        assert found == [("old", None)]
    finally:
        engine.dispose()
