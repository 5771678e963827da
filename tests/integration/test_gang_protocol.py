"""The gang protocol as workers speak it over HTTP to a real `repro serve` (SQLite and
PostgreSQL), without training: a gang that does not complete in time lets its members go
and the run says why; cancelling a training gang's run stops every member; a member that
stops heartbeating, rank 0 included, ends the attempt for all, whose late reports are
refused, and a new gang takes the run on its next attempt."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from service.config import Settings
from service.persistence.engine import make_engine, make_sessionmaker
from service.persistence.models import GangMember, Run, utcnow
from service.runs import gangs
from tests.integration.service_procs import Service
from tests.integration.test_server_verification import SEED001, run_of

LEASE = 8.0  # seconds: lapses happen within the test, slow requests of a loaded machine do not
FORM = 2.0  # REPRO_GANG_FORM_SECONDS


@pytest.fixture
def service(database_url: str | None, tmp_path: Path) -> Iterator[Service]:
    env = {
        "REPRO_LEASE_SECONDS": f"{LEASE:g}",
        "REPRO_HEARTBEAT_SECONDS": "1",
        "REPRO_LEASE_GRACE_SECONDS": "0",
        "REPRO_GANG_FORM_SECONDS": f"{FORM:g}",
        "REPRO_MAX_ATTEMPTS": "2",
    }
    svc = Service(tmp_path / "data", database_url=database_url, env=env, extra=("--no-demo",))
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


class GangWorker:
    """A registered worker that joins gangs at `127.0.0.1:<port>` and reports as told."""

    def __init__(self, svc: Service, name: str, port: int) -> None:
        self.http = svc.client_for("worker", name)
        answer = self.http.post("/api/v1/workers/register", json={"name": name, "images": []})
        assert answer.status_code == 201, answer.text
        self.id = int(answer.json()["id"])
        self.address = f"127.0.0.1:{port}"

    def join(self) -> dict[str, Any]:
        answer = self.http.post(f"/api/v1/workers/{self.id}/gang", json={"address": self.address})
        assert answer.status_code == 200, answer.text
        out: dict[str, Any] = answer.json()
        return out

    def claim(self) -> int | None:
        answer = self.http.post(f"/api/v1/workers/{self.id}/claim")
        assert answer.status_code in (200, 204), answer.text
        return int(answer.json()["run"]["id"]) if answer.status_code == 200 else None

    def heartbeat(self, run_id: int, attempt: int) -> int:
        body = {"worker_id": self.id, "attempt": attempt}
        return self.http.post(f"/api/v1/runs/{run_id}/heartbeat", json=body).status_code

    def release(self, run_id: int, attempt: int, reason: str) -> dict[str, Any]:
        body = {"worker_id": self.id, "attempt": attempt, "reason": reason}
        answer = self.http.post(f"/api/v1/runs/{run_id}/release", json=body)
        assert answer.status_code == 200, answer.text
        out: dict[str, Any] = answer.json()
        return out

    def done(self, run_id: int, attempt: int) -> int:
        body = {"worker_id": self.id, "attempt": attempt}
        return self.http.post(f"/api/v1/runs/{run_id}/gang/done", json=body).status_code


def _submit(svc: Service, hosts: int, name: str) -> int:
    body = yaml.safe_load(SEED001)
    body["name"] = name
    body["dataset"]["shards"] = 2
    body["distribution"] = {"hosts": hosts}
    created = svc.client.post("/api/v1/experiments", json=body)
    assert created.status_code == 201, created.text
    return int(created.json()["run"]["id"])


def _until(what: Callable[[], Any], timeout: float, step: float = 0.25) -> Any:
    """`what()` once it is truthy; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, f"still {found!r} after {timeout} s"
        time.sleep(step)
    return found


def _formed(*workers: GangWorker) -> dict[int, dict[str, Any]]:
    """The workers join, in turn, until their gang forms: each one's answer, by rank."""
    answers: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + 10
    while len(answers) < len(workers):
        assert time.monotonic() < deadline, answers
        for worker in workers:
            answer = worker.join()
            assert answer["state"] in ("none", "forming", "formed"), answer
            if answer["state"] == "formed":
                answers[int(answer["rank"])] = {**answer, "worker": worker}
    return answers


def test_a_gang_that_does_not_complete_in_time_lets_its_member_go_and_says_so(
    service: Service,
) -> None:
    a, b = GangWorker(service, "a", 40001), GangWorker(service, "b", 40002)
    gang_run = _submit(service, 2, "two-hosts")
    assert b.join()["state"] == "none"
    forming = a.join()
    assert forming == {**forming, "state": "forming", "run_id": gang_run, "joined": 1}
    said = run_of(service, gang_run)["waiting_reason"]
    assert "its gang is forming: 1 of 2 workers have joined" in said, said

    # b takes a one-host run instead: a's gang cannot complete, and is let go in time.
    single = _submit(service, 1, "one-host")
    assert b.claim() == single
    time.sleep(FORM + 0.2)
    assert b.heartbeat(single, 1) == 200  # b trains on
    assert a.join()["state"] == "none"  # let go: nobody idle to complete it with
    run = run_of(service, gang_run)
    assert run["status"] == "queued" and run["attempt"] == 0
    said = run["waiting_reason"]
    assert "its last gang did not complete: 1 of 2 workers joined and were let go" in said
    assert a.claim() is None  # a holds nothing and is free for other work (none is queued)

    # Once both are idle again, the gang forms and starts the run.
    service.client.post(f"/api/v1/runs/{single}/cancel")
    gang = _formed(a, b)
    assert gang[0]["run_id"] == gang[1]["run_id"] == gang_run
    cluster = [gang[0]["worker"].address, gang[1]["worker"].address]
    assert gang[0]["cluster"] == gang[1]["cluster"] == cluster
    assert set(cluster) == {a.address, b.address}
    run = run_of(service, gang_run)
    assert run["status"] == "running" and run["worker_id"] == gang[0]["worker"].id
    assert run["waiting_reason"] is None


def test_cancelling_a_training_gang_stops_every_member_and_frees_them(
    service: Service,
) -> None:
    a, b = GangWorker(service, "a", 40011), GangWorker(service, "b", 40012)
    run_id = _submit(service, 2, "cancelled")
    gang = _formed(a, b)
    attempt = int(gang[0]["claim"]["run"]["attempt"])
    assert int(gang[1]["claim"]["run"]["attempt"]) == attempt == 1
    assert a.heartbeat(run_id, attempt) == 200 and b.heartbeat(run_id, attempt) == 200

    cancelled = service.client.post(f"/api/v1/runs/{run_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    # Both members' next heartbeats say the run is no longer theirs: their jobs stop.
    assert a.heartbeat(run_id, attempt) == 409
    assert b.heartbeat(run_id, attempt) == 409
    assert b.done(run_id, attempt) == 409
    # Neither is held: both join the next gang run at once.
    following = _submit(service, 2, "following")
    gang = _formed(a, b)
    assert gang[0]["run_id"] == gang[1]["run_id"] == following
    assert run_of(service, run_id)["status"] == "cancelled"


@pytest.mark.parametrize("silent_rank", [1, 0])
def test_a_member_that_stops_heartbeating_ends_the_attempt_for_all(
    service: Service, silent_rank: int
) -> None:
    a, b = GangWorker(service, "a", 40021), GangWorker(service, "b", 40022)
    run_id = _submit(service, 2, f"lost-rank-{silent_rank}")
    gang = _formed(a, b)
    attempt = int(gang[0]["claim"]["run"]["attempt"])
    silent, talking = gang[silent_rank]["worker"], gang[1 - silent_rank]["worker"]

    def requeued() -> bool:
        assert talking.heartbeat(run_id, attempt) in (200, 409)
        assert talking.claim() is None  # a claim sweeps lapsed leases and lost members
        return bool(run_of(service, run_id)["status"] == "queued")

    _until(requeued, timeout=4 * LEASE)
    # The attempt is over for every member: neither may report on it any more.
    assert talking.heartbeat(run_id, attempt) == 409
    assert silent.heartbeat(run_id, attempt) == 409
    assert talking.done(run_id, attempt) == 409
    run = run_of(service, run_id)
    assert run["worker_id"] is None and run["attempt"] == attempt

    # A new gang of the same two takes it on the next attempt; rank 0 holds it again.
    gang = _formed(a, b)
    assert gang[0]["run_id"] == run_id
    assert int(gang[0]["claim"]["run"]["attempt"]) == attempt + 1
    assert gang[0]["worker"].heartbeat(run_id, attempt + 1) == 200
    assert gang[1]["worker"].heartbeat(run_id, attempt + 1) == 200
    assert gang[1]["worker"].done(run_id, attempt + 1) == 204
    assert run_of(service, run_id)["worker_id"] == gang[0]["worker"].id


def test_a_gang_whose_member_fails_every_attempt_fails_after_the_most_attempts(
    service: Service,
) -> None:
    a, b = GangWorker(service, "a", 40031), GangWorker(service, "b", 40032)
    run_id = _submit(service, 2, "failing-member")
    for attempt in (1, 2):  # REPRO_MAX_ATTEMPTS is 2
        gang = _formed(a, b)
        assert int(gang[1]["claim"]["run"]["attempt"]) == attempt
        # Member 1's job fails, before any checkpoint; it gives the run back.
        released = gang[1]["worker"].release(run_id, attempt, "gang member 1 failed: boom")
        assert gang[0]["worker"].heartbeat(run_id, attempt) == 409  # over for rank 0 too
        if attempt == 1:
            assert released["status"] == "queued"
    assert released["status"] == "failed"
    assert released["error"]["type"] == "GangFailed"
    message = released["error"]["message"]
    assert "gave up after 2 gang attempts that ended before a checkpoint" in message
    assert "gang member 1 failed: boom" in message
    assert a.join()["state"] == b.join()["state"] == "none"  # nothing left to form for


def test_a_join_that_lost_the_race_to_form_lets_only_unranked_members_go(
    service: Service, database_url: str | None
) -> None:
    a, b = GangWorker(service, "a", 40041), GangWorker(service, "b", 40042)
    c = GangWorker(service, "c", 40043)
    run_id = _submit(service, 2, "raced")
    gang = _formed(a, b)
    attempt = int(gang[0]["claim"]["run"]["attempt"])
    # c joined at the same time and read the members after a and b's gang committed (as a
    # statement of its own does on PostgreSQL): it finds its run started by the other.
    settings = Settings(data_dir=service.data_dir, database_url=database_url or "")
    engine = make_engine(settings.resolved_database_url, pool_size=1, max_overflow=0)
    try:
        with make_sessionmaker(engine)() as db:
            run = db.get(Run, run_id)
            assert run is not None
            now = utcnow()
            late = GangMember(
                run_id=run_id,
                attempt=attempt,
                worker_id=c.id,
                address=c.address,
                joined_at=now,
                seen_at=now,
            )
            db.add(late)
            db.flush()
            members = list(db.scalars(select(GangMember).where(GangMember.run_id == run_id)))
            assert len(members) == 3
            gangs._form(db, settings, run, members, now)
            db.commit()
    finally:
        engine.dispose()
    # The gang trains on: both members keep their places; c is free.
    assert gang[1]["worker"].heartbeat(run_id, attempt) == 200
    assert gang[0]["worker"].heartbeat(run_id, attempt) == 200
    assert c.join()["state"] == "none"
