"""A finished result is never lost: the outbox on disk and its delivery to the real API.

The API is the real application in this process, on a fresh SQLite database. Between it and
the worker's client sits a network that can answer 429 or 503 or drop the connection for
the next few requests of a kind: the faults a worker meets, not a stand-in for the server.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.app import create_app
from service.auth.tokens import create_token
from service.config import Settings
from service.persistence.migrate import upgrade
from worker.node.client import ApiClient
from worker.node.reports import Courier, Outbox, Report

REPO = Path(__file__).resolve().parents[2]
SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
Fault = Callable[[httpx.Request], httpx.Response]
ERROR = {"type": "JobCrashed", "message": "the job ended with signal SIGKILL", "traceback": ""}


def busy(retry_after: int) -> Fault:
    """A 429 with Retry-After, as the API answers a client it limits."""
    return lambda request: httpx.Response(
        429, json={"detail": "too many requests"}, headers={"Retry-After": str(retry_after)}
    )


def unavailable(request: httpx.Request) -> httpx.Response:
    return httpx.Response(503, json={"detail": "overloaded"})


def dropped(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


class App:
    """The ASGI app served on an event loop of its own, called from synchronous code."""

    def __init__(self, app: Any, token: str | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        headers = {"Authorization": f"Bearer {token}"} if token else {}

        async def make() -> httpx.AsyncClient:
            return httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://api", headers=headers
            )

        self._client = self._run(make())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(60)

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        response: httpx.Response = self._run(self._client.request(method, url, **kwargs))
        return response

    def get(self, url: str) -> httpx.Response:
        return self.request("GET", url)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def close(self) -> None:
        self._run(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


@dataclass
class Network(httpx.BaseTransport):
    """Passes requests to the in-process app, except the queued faults of a path suffix."""

    app: App
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    # (path, monotonic time, status: None when the network itself answered or dropped it)
    seen: list[tuple[str, float, int | None]] = field(default_factory=list)
    on_request: Callable[[httpx.Request], None] | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path, now = request.url.path, time.monotonic()
        if self.on_request is not None:
            self.on_request(request)
        for suffix, queued in self.faults.items():
            if path.endswith(suffix) and queued:
                self.seen.append((path, now, None))
                return queued.pop(0)(request)
        request.read()
        answer = self.app.request(
            request.method,
            request.url.raw_path.decode(),
            content=request.content,
            headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
        )
        headers = {
            k: v
            for k, v in answer.headers.items()
            if k.lower() not in ("content-length", "content-encoding")
        }
        self.seen.append((path, now, answer.status_code))
        return httpx.Response(answer.status_code, headers=headers, content=answer.content)

    def times(self, suffix: str, status: int | None = None) -> list[float]:
        """When requests to paths ending in `suffix` went out (those the app answered `status`)."""
        return [
            t
            for path, t, code in self.seen
            if path.endswith(suffix) and (status is None or code == status)
        ]


@dataclass
class World:
    """The API with a queued run that a registered worker has claimed."""

    api: App  # as the submitter
    network: Network
    worker_token: str
    worker_id: int
    run_id: int
    outbox: Outbox

    def client(self) -> ApiClient:
        """A worker's API client over the faulty network (a fresh one: a restarted agent)."""
        return ApiClient(
            "http://api.test", self.worker_token, transport=self.network, retries=0, backoff=0
        )

    def courier(self, client: ApiClient, stop: threading.Event | None = None) -> Courier:
        return Courier(
            client,
            self.outbox,
            stop=stop or threading.Event(),
            heartbeat_seconds=0.2,
            first_backoff=0.05,
            max_backoff=0.2,
        )

    def run(self) -> dict[str, Any]:
        got: dict[str, Any] = self.api.get(f"/api/v1/runs/{self.run_id}").json()
        return got

    def complete_report(self, uploads: list[dict[str, Any]]) -> Report:
        """A failed run's result, with files kept beside it to upload first."""
        return Report(
            kind="complete",
            run_id=self.run_id,
            worker_id=self.worker_id,
            body={
                "result": {"status": "failed", "error": {"type": "E", "message": "m"}},
                "uploads": uploads,
            },
        )

    def fail_report(self, worker_id: int | None = None) -> Report:
        return Report(
            kind="fail",
            run_id=self.run_id,
            worker_id=worker_id or self.worker_id,
            body={"error": ERROR},
        )


@pytest.fixture
def lease_seconds() -> float:
    return 30.0


@pytest.fixture
def world(tmp_path: Path, lease_seconds: float) -> Iterator[World]:
    settings = Settings(data_dir=tmp_path / "data", database_url="", lease_seconds=lease_seconds)
    upgrade(settings.resolved_database_url)
    app = create_app(settings)
    with app.state.sessionmaker() as db:
        submitter = create_token(db=db, name="submitter", role="submitter")[1]
        worker_token = create_token(db=db, name="worker", role="worker")[1]
    api = App(app, submitter)
    network = Network(App(app))
    try:
        submitted = api.post(
            "/api/v1/experiments", content=SEED001, headers={"Content-Type": "application/yaml"}
        )
        assert submitted.status_code == 201, submitted.text
        with ApiClient("http://api.test", worker_token, transport=network) as client:
            worker = client.register(
                "w", executors=["process"], images=[], gpu=None, hostname="node"
            )
            claim = client.claim(worker["id"])
        assert claim is not None
        yield World(
            api=api,
            network=network,
            worker_token=worker_token,
            worker_id=int(worker["id"]),
            run_id=int(claim["run"]["id"]),
            outbox=Outbox(tmp_path / "work" / "outbox"),
        )
    finally:
        api.close()
        network.app.close()
        app.state.engine.dispose()


# -- the outbox on disk ------------------------------------------------------------------------


def test_a_stored_report_reads_back_whole_and_owner_only(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox")
    report = Report(kind="complete", run_id=7, worker_id=3, body={"result": {"status": "x"}})
    path = outbox.put(report)
    assert path.name == "run-7.json" and path.stat().st_mode & 0o777 == 0o600
    assert outbox.directory.stat().st_mode & 0o777 == 0o700
    assert outbox.pending() == [report]
    assert sorted(p.name for p in outbox.directory.iterdir()) == ["run-7.json"]  # no temp file
    outbox.remove(report)
    assert outbox.pending() == []


def test_a_write_that_fails_halfway_leaves_the_stored_report_intact(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox")
    kept = Report(kind="release", run_id=7, worker_id=3, body={"reason": "stopping"})
    outbox.put(kept)
    # The JSON encoder fails after it has written part of the document.
    broken = Report(kind="complete", run_id=7, worker_id=3, body={"a": "x" * 10_000, "b": {1j}})
    with pytest.raises(TypeError):
        outbox.put(broken)
    assert outbox.pending() == [kept]
    assert sorted(p.name for p in outbox.directory.iterdir()) == ["run-7.json"]


def test_a_damaged_file_is_set_aside_and_the_others_still_come_back(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox")
    good = Report(kind="fail", run_id=2, worker_id=3, body={"error": ERROR})
    outbox.put(good)
    (outbox.directory / "run-1.json").write_text('{"kind": "complete", "run_')
    assert outbox.pending() == [good]
    assert (outbox.directory / "run-1.json.unreadable").exists()
    with pytest.raises(ValueError):
        outbox.path("../../etc/passwd")  # a run id never leaves the outbox directory


# -- delivery to the real API ------------------------------------------------------------------


def test_the_report_is_on_disk_before_it_is_sent_and_gone_once_taken(world: World) -> None:
    on_disk: list[bool] = []
    world.network.on_request = lambda request: on_disk.append(
        request.url.path.endswith("/fail") and world.outbox.path(world.run_id).exists()
    )
    with world.client() as client:
        assert world.courier(client).deliver(world.fail_report()) == "accepted"
    assert on_disk == [True]
    assert world.run()["status"] == "failed" and world.run()["error"]["type"] == "JobCrashed"
    assert world.outbox.pending() == []


def test_a_429_is_waited_out_as_asked_while_heartbeats_keep_the_lease(world: World) -> None:
    world.network.faults["/fail"] = [busy(1), busy(1)]
    with world.client() as client:
        assert world.courier(client).deliver(world.fail_report()) == "accepted"
    attempts = world.network.times("/fail")
    assert len(attempts) == 3
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(attempts))
    kept = world.network.times("/heartbeat", status=200)  # the API extended the lease
    assert any(attempts[0] < t < attempts[1] for t in kept)
    done = world.run()
    assert done["status"] == "failed" and done["error"] == {**done["error"], **ERROR}
    assert world.outbox.pending() == []


def test_dropped_connections_and_5xx_are_retried_until_taken(world: World) -> None:
    world.network.faults["/fail"] = [dropped, unavailable, dropped, unavailable]
    with world.client() as client:
        assert world.courier(client).deliver(world.fail_report()) == "accepted"
    assert len(world.network.times("/fail")) == 5
    assert world.run()["status"] == "failed" and world.outbox.pending() == []


def test_a_run_the_worker_no_longer_holds_is_refused_and_dropped(world: World) -> None:
    assert world.api.post(f"/api/v1/runs/{world.run_id}/cancel").status_code == 200
    with world.client() as client:
        assert world.courier(client).deliver(world.fail_report()) == "refused"
    assert len(world.network.times("/fail")) == 1  # a definitive no is not asked again
    assert world.run()["status"] == "cancelled" and world.outbox.pending() == []


def test_a_report_kept_by_a_stopping_agent_is_sent_by_the_next_one(world: World) -> None:
    world.network.faults["/fail"] = [unavailable]
    stop = threading.Event()
    stop.set()  # the agent is stopping: one try, then the report stays for the next start
    with world.client() as client:
        assert world.courier(client, stop).deliver(world.fail_report()) == "kept"
    assert world.outbox.pending() == [world.fail_report()]
    assert world.run()["status"] == "running"

    # The next agent on this work directory registers anew (by default under a name of its
    # own, so as a new worker), then sends what was left as the worker that held the run.
    with world.client() as client:
        again = client.register(
            "w-restarted", executors=["process"], images=[], gpu=None, hostname="node"
        )
        assert again["id"] != world.worker_id
        assert world.courier(client).deliver_pending() == 1
    assert world.run()["status"] == "failed" and world.run()["worker_id"] == world.worker_id
    assert world.outbox.pending() == []


def test_a_checkpoint_kept_beside_the_report_is_uploaded_before_it(world: World) -> None:
    files = world.outbox.files_dir(world.run_id)
    files.mkdir(parents=True)
    (files / "epoch-000003.npz").write_bytes(b"arrays")
    (files / "epoch-000003.json").write_text('{"epoch": 3}')
    report = world.complete_report(
        [{"file": "epoch-000003.npz", "epoch": 3}, {"file": "epoch-000003.json", "epoch": 3}]
    )
    world.network.faults["/artifacts"] = [unavailable, dropped]
    with world.client() as client:
        assert world.courier(client).deliver(report) == "accepted"
    sent = [path.rsplit("/", 1)[-1] for path, _, code in world.network.seen if code is not None]
    sent = [name for name in sent if name != "heartbeat"]
    assert sent[-3:] == ["artifacts", "artifacts", "complete"]
    assert world.run()["checkpoint_epoch"] == 3 and world.run()["status"] == "failed"
    assert not files.exists() and world.outbox.pending() == []


@pytest.mark.parametrize("lease_seconds", [1.0])
def test_the_lease_holds_while_a_delivery_outlasts_it(world: World, lease_seconds: float) -> None:
    # Eight checkpoints kept through an outage, each upload taking half the lease: the
    # delivery takes four leases. Another worker asks for work all the while; the run must
    # stay with its holder, and its result and every checkpoint must be taken.
    files = world.outbox.files_dir(world.run_id)
    files.mkdir(parents=True)
    uploads = []
    for epoch in range(1, 9):
        (files / f"epoch-{epoch:06d}.npz").write_bytes(b"arrays")
        uploads.append({"file": f"epoch-{epoch:06d}.npz", "epoch": epoch})
    report = world.complete_report(uploads)

    def slow_uploads(request: httpx.Request) -> None:
        if request.url.path.endswith("/artifacts"):
            time.sleep(lease_seconds / 2)

    world.network.on_request = slow_uploads
    taken: list[dict[str, Any] | None] = []
    delivering = threading.Event()

    def rival() -> None:
        with ApiClient("http://api.test", world.worker_token, transport=world.network) as client:
            other = client.register(
                "rival", executors=["process"], images=[], gpu=None, hostname="node"
            )
            while delivering.is_set():
                taken.append(client.claim(other["id"]))
                time.sleep(0.1)

    delivering.set()
    asker = threading.Thread(target=rival)
    asker.start()
    try:
        with world.client() as client:
            courier = Courier(
                client, world.outbox, stop=threading.Event(), heartbeat_seconds=lease_seconds / 4
            )
            assert courier.deliver(report) == "accepted"
    finally:
        delivering.clear()
        asker.join()
    assert taken and not any(taken)  # the rival was never given the run
    done = world.run()
    assert done["status"] == "failed" and done["attempt"] == 1
    assert len(world.network.times("/artifacts", status=201)) == 8  # each taken as the holder's
    assert world.outbox.pending() == []


# -- the job's log with the heartbeats ---------------------------------------------------------


class _Handle:
    """A job handle that only records the signals it is sent (no process runs here)."""

    def __init__(self) -> None:
        self.signals: list[int] = []

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)


def test_an_api_that_refuses_the_log_gets_none_and_the_run_goes_on(
    world: World, tmp_path: Path
) -> None:
    """An agent newer than its API: the heartbeat carrying log lines is refused (422, as a
    server without logs answers an unknown field); the agent drops the log, not the run."""
    from worker.node.job import ClaimedRun, Job

    refused = lambda request: httpx.Response(422, json={"detail": "log: extra field"})  # noqa: E731
    world.network.faults["/heartbeat"] = [refused]
    bodies: list[bytes] = []
    world.network.on_request = lambda r: (
        bodies.append(r.read()) if "heartbeat" in r.url.path else None
    )
    with world.client() as client:
        claimed = ClaimedRun(
            {"run": {"id": world.run_id, "attempt": 1}},
            client=client,
            executor=None,  # type: ignore[arg-type]  # nothing is started here
            worker_id=world.worker_id,
            work_dir=tmp_path / "work",
            stop=threading.Event(),
            watch=lambda job: 0,
            outbox=world.outbox,
            heartbeat_seconds=0.2,
            progress_seconds=0.1,
        )
        handle = _Handle()
        job = Job(world.run_id, handle)  # type: ignore[arg-type]
        job.log.add("epoch 1: loss 0.7")
        beats = threading.Thread(target=claimed._heartbeat_loop, args=(job,), daemon=True)
        beats.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not world.network.times("/heartbeat", status=200):
            time.sleep(0.1)
        job.log.add("epoch 2: loss 0.6")  # after the refusal: not kept, not sent
        time.sleep(1.5)
        job.reported.set()
        beats.join(10)
    assert b'"log"' in bodies[0] and all(b'"log"' not in b for b in bodies[1:])
    assert world.network.times("/heartbeat", status=200), world.network.seen
    assert not job.abandoned.is_set() and handle.signals == [] and job.log.refused
    logged = world.api.get(f"/api/v1/runs/{world.run_id}/log").json()
    assert logged["text"] == "" and world.run()["status"] == "running"
