"""SIGKILL the API in the middle of a burst of submissions, then restart it.

Clients that retry with the same Idempotency-Key must end with every spec stored exactly
once: nothing answered is lost to the crash, and a request that was committed but never
answered is replayed, not stored a second time.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.jobs import REPO
from tests.integration.service_procs import Service

pytestmark = pytest.mark.slow

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
SUBMISSIONS = 500
CLIENTS = 8
KILL_AFTER = 150  # finished submissions before the SIGKILL: well inside the burst
# A submission keeps retrying through the restart (a few seconds of refused connections).
SUBMISSION_SECONDS = 60.0
MAX_ATTEMPTS = 200
BURST_SECONDS = 100.0


class RestartableService:
    """`repro serve` on one data directory and database, across SIGKILLs and restarts.

    A restarted server listens on a new port, so clients read `url` before every attempt
    instead of keeping a base URL. The data directory keeps the admin token, which the new
    process finds valid in the database and keeps using.
    """

    def __init__(self, data_dir: Path, database_url: str | None) -> None:
        self.data_dir, self.database_url = data_dir, database_url
        self._lock = threading.Lock()
        self.generations: list[Service] = []
        self._current = self._spawn()

    def _spawn(self) -> Service:
        service = Service(self.data_dir, database_url=self.database_url, extra=("--no-demo",))
        self.generations.append(service)  # before wait_ready, so stop() reaches it on failure
        return service

    @property
    def current(self) -> Service:
        with self._lock:
            return self._current

    @property
    def url(self) -> str:
        return self.current.url

    def kill_and_restart(self) -> int:
        """SIGKILL the current process, start a new one, wait for it; the old exit status."""
        old = self.current
        os.kill(old.proc.pid, signal.SIGKILL)
        returncode = old.proc.wait(timeout=30)
        new = self._spawn()
        with self._lock:
            self._current = new
        new.wait_ready()
        return returncode

    def stop(self) -> None:
        for service in self.generations:
            service.stop()


@dataclass
class Submission:
    index: int
    name: str
    key: str
    body: str
    status: int = 0
    experiment_id: int | None = None
    run_id: int | None = None
    attempts: int = 0
    failures: list[str] = field(default_factory=list)


def _submission(index: int) -> Submission:
    name = f"crash-burst-{index:03d}"
    body, replaced = re.subn(r"(?m)^name: .*$", f"name: {name}", SEED001)
    assert replaced == 1
    return Submission(index=index, name=name, key=f"crash-safety-{index:03d}", body=body)


class Burst:
    """Submissions from several client threads, each retried with its key until answered."""

    def __init__(self, service: RestartableService, token: str) -> None:
        self.service = service
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/yaml"}
        self.finished = 0
        self.enough_finished = threading.Event()
        self.aborted = threading.Event()
        self.deadline = time.monotonic() + BURST_SECONDS
        self._lock = threading.Lock()

    def submit(self, client: httpx.Client, sub: Submission) -> None:
        deadline = min(time.monotonic() + SUBMISSION_SECONDS, self.deadline)
        pause = 0.05
        while (
            sub.attempts < MAX_ATTEMPTS
            and time.monotonic() < deadline
            and not self.aborted.is_set()
        ):
            sub.attempts += 1
            try:
                response = client.post(
                    f"{self.service.url}/api/v1/experiments",
                    content=sub.body,
                    headers={**self.headers, "Idempotency-Key": sub.key},
                )
            except httpx.TransportError as exc:
                sub.failures.append(type(exc).__name__)
            else:
                if response.status_code < 500:
                    sub.status = response.status_code
                    if response.status_code in (200, 201):
                        out = response.json()
                        sub.experiment_id = out["experiment"]["id"]
                        sub.run_id = out["run"]["id"]
                    else:
                        sub.failures.append(f"{response.status_code} {response.text[:200]}")
                    break
                sub.failures.append(f"{response.status_code} {response.text[:200]}")
            # Back off so a restarting server is not hammered with refused connections.
            time.sleep(pause)
            pause = min(pause * 1.5, 0.5)
        with self._lock:
            self.finished += 1
            if self.finished >= KILL_AFTER:
                self.enough_finished.set()

    def client_loop(self, subs: list[Submission]) -> None:
        with httpx.Client(timeout=10) as client:
            for sub in subs:
                self.submit(client, sub)


def _all_items(client: httpx.Client, path: str, limit: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for _ in range(100):
        page = client.get(path, params={"limit": limit, "offset": len(items), "count": "true"})
        assert page.status_code == 200, page.text
        body = page.json()
        items += body["items"]
        if not body["items"] or len(items) >= body["total"]:
            assert len(items) == body["total"]
            return items
    raise AssertionError(f"{path}: paging did not end")


@pytest.fixture
def service(tmp_path: Path, database_url: str | None) -> Iterator[RestartableService]:
    service = RestartableService(tmp_path / "data", database_url)
    try:
        service.current.wait_ready()
        yield service
    finally:
        service.stop()


def test_sigkill_during_submission_burst_loses_and_duplicates_nothing(
    service: RestartableService,
) -> None:
    subs = [_submission(i) for i in range(SUBMISSIONS)]
    burst = Burst(service, service.current.token("submitter", "burst"))
    with ThreadPoolExecutor(CLIENTS, thread_name_prefix="submitter") as pool:
        futures = [pool.submit(burst.client_loop, subs[i::CLIENTS]) for i in range(CLIENTS)]
        try:
            assert burst.enough_finished.wait(timeout=60), "the burst stalled before the kill"
            finished_at_kill = burst.finished
            returncode = service.kill_and_restart()
            for future in futures:
                future.result(timeout=max(1.0, burst.deadline - time.monotonic() + 5))
        except BaseException:
            burst.aborted.set()  # so leaving the pool does not wait out every retry budget
            raise

    assert returncode == -signal.SIGKILL
    assert KILL_AFTER <= finished_at_kill < SUBMISSIONS, "the kill must land inside the burst"
    unanswered = [(s.name, s.status, s.failures[-3:]) for s in subs if s.status not in (200, 201)]
    assert not unanswered, unanswered
    # Without retries the kill would not have been noticed, and the test would prove nothing.
    assert any(s.attempts > 1 for s in subs)
    # A replay (200) is only right for a key whose earlier attempt went unanswered.
    assert all(s.attempts > 1 for s in subs if s.status == 200)

    client = service.current.client
    experiments = _all_items(client, "/api/v1/experiments", limit=500)
    names = Counter(e["name"] for e in experiments)
    assert [n for n, count in names.items() if count > 1] == []
    assert set(names) == {s.name for s in subs}
    by_id = {e["id"]: e["name"] for e in experiments}
    assert all(by_id.get(s.experiment_id) == s.name for s in subs)

    # Each experiment came with exactly its one queued run: no half-stored submission.
    runs = _all_items(client, "/api/v1/runs", limit=200)
    assert len(runs) == SUBMISSIONS
    assert Counter(r["experiment_id"] for r in runs) == Counter(by_id.keys())
    assert {r["status"] for r in runs} == {"queued"}
    assert {r["id"]: r["experiment_id"] for r in runs} == {s.run_id: s.experiment_id for s in subs}

    # Each key still names exactly the experiment its client was answered with.
    with httpx.Client(base_url=service.url, timeout=30) as replayer:
        for s in subs:
            again = replayer.post(
                "/api/v1/experiments",
                content=s.body,
                headers={**burst.headers, "Idempotency-Key": s.key},
            )
            assert again.status_code == 200, again.text
            assert again.json()["experiment"]["id"] == s.experiment_id
            assert again.json()["run"]["id"] == s.run_id
    assert len(_all_items(client, "/api/v1/experiments", limit=500)) == SUBMISSIONS
