"""A worker never loses a finished result: real servers, real worker agents, real TensorFlow.

Whatever happens between the job's end and the API taking its report (someone else's bad
tokens from the worker's address, the API killed and restarted, the agent killed and
restarted), the run ends with the result the worker computed, recorded once.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration import service_procs
from tests.integration.jobs import blobs_spec
from tests.integration.service_procs import Service, WorkerProc

pytestmark = pytest.mark.slow


def _spec(epochs: int, train_batches: int) -> str:
    spec = blobs_spec()
    spec["dataset"] = {**spec["dataset"], "batch_size": 256, "train_batches": train_batches}
    spec["training"]["epochs"] = epochs
    return json.dumps(spec)


def _wait_for(what: str, condition: Any, seconds: float = 240) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def _attempt_result(work_dir: Path, run_id: int) -> dict[str, Any]:
    """The result document the worker's job wrote for the run's first attempt."""
    data: dict[str, Any] = json.loads(
        (work_dir / "runs" / str(run_id) / "attempt-1" / "result.json").read_text()
    )
    return data


def test_bad_tokens_from_the_worker_s_address_do_not_cost_its_result(tmp_path: Path) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",)).wait_ready()
    work_dir = tmp_path / "worker"
    token = service.token("worker", "w")
    worker = None
    try:
        worker = WorkerProc(service.url, work_dir, token=token, name="w")
        submitted = service.submit(_spec(epochs=4, train_batches=20), "application/json")
        run_id = submitted.json()["run"]["id"]
        _wait_for(
            "the job to start",
            lambda: service.client.get(f"/api/v1/runs/{run_id}").json()["status"] == "running",
        )
        # Another client on the same address (127.0.0.1) sends 30 bad tokens during the job:
        # malformed ones, and more wrong secrets for the worker's own token than the limit.
        token_id = token.split("_")[1]
        bad = ["garbage"] * 5 + [f"rpt_{token_id}_{'y' * 30}{i:02d}" for i in range(25)]
        with httpx.Client(base_url=service.url, timeout=30) as hostile:
            codes = [
                hostile.get("/api/v1/runs", headers={"Authorization": f"Bearer {t}"}).status_code
                for t in bad
            ]
        assert codes.count(429) > 0 and set(codes) == {401, 429}  # the limiter did engage
        done = service.wait_run(run_id)
        assert done["status"] == "succeeded", done["error"]
        assert done["final_fingerprint"] == _attempt_result(work_dir, run_id)["final_fingerprint"]
        assert done["attempt"] == 1
        # The agent forgets the report once the API's answer reaches it, just after the run
        # shows as succeeded.
        _wait_for("the outbox to empty", lambda: not list((work_dir / "outbox").glob("run-*")), 30)
    finally:
        if worker is not None:
            worker.stop()
        service.stop()
    log = (work_dir / "agent.log").read_text()
    assert "dropped" not in log and "abandoned" not in log


def _serve_again(
    data_dir: Path, port: int, database_url: str | None, monkeypatch: pytest.MonkeyPatch
) -> Service:
    """`repro serve` on the data directory, database and port of a server that was killed."""
    with monkeypatch.context() as patch:
        patch.setattr(service_procs, "free_port", lambda: port)
        return Service(data_dir, database_url=database_url, extra=("--no-demo",)).wait_ready()


@pytest.mark.parametrize(
    ("database", "agent"),
    [
        ("sqlite", "keeps running"),
        ("sqlite", "is killed and restarted"),
        ("postgresql", "is killed and restarted"),
    ],
)
def test_a_result_finished_while_the_api_is_down_is_recorded_once_it_is_back(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    database: str,
    agent: str,
) -> None:
    url = request.getfixturevalue("postgres_url") if database == "postgresql" else None
    data_dir, work_dir = tmp_path / "data", tmp_path / "worker"
    first = Service(data_dir, database_url=url, extra=("--no-demo",)).wait_ready()
    token = first.token("worker", "w")
    workers: list[WorkerProc] = []
    second: Service | None = None
    try:
        workers.append(WorkerProc(first.url, work_dir, token=token, name="w"))
        run_id = first.submit(_spec(epochs=10, train_batches=30), "application/json").json()["run"][
            "id"
        ]

        def started() -> bool:
            run = first.client.get(f"/api/v1/runs/{run_id}").json()
            # Any progress at all: the job is training (a fast machine may report only
            # epoch starts and ends between two looks).
            return run["status"] == "running" and bool((run.get("progress") or {}).get("event"))

        _wait_for("the job to train", started)
        held_by = first.client.get(f"/api/v1/runs/{run_id}").json()["worker_id"]
        first.proc.send_signal(signal.SIGKILL)  # the API dies mid-job, no goodbye
        first.proc.wait()
        first.stop()

        # The job ends while the API is down: its report waits in the outbox.
        entry = work_dir / "outbox" / f"run-{run_id}.json"
        _wait_for("the report to be kept on disk", entry.exists)
        kept = json.loads(entry.read_text())
        assert kept["kind"] == "complete" and kept["body"]["result"]["status"] == "succeeded"
        assert kept["worker_id"] == held_by
        if agent != "keeps running":
            workers[0].kill()  # the agent dies too; its report is only on disk now
            assert entry.exists()

        second = _serve_again(data_dir, first.port, url, monkeypatch)
        if agent != "keeps running":
            workers.append(WorkerProc(second.url, work_dir, token=token, name="w-again"))
        done = second.wait_run(run_id)
        assert done["status"] == "succeeded", done["error"]
        assert done["final_fingerprint"] == kept["body"]["result"]["final_fingerprint"]
        assert done["final_fingerprint"] == _attempt_result(work_dir, run_id)["final_fingerprint"]
        assert done["worker_id"] == held_by and done["attempt"] == 1  # never run twice
        assert [p["kind"] for p in done["trace"]] == ["init"] + ["epoch"] * 10  # recorded once
        assert second.client.get("/api/v1/runs", params={"count": "true"}).json()["total"] == 1
        _wait_for("the outbox to empty", lambda: not list((work_dir / "outbox").glob("run-*")), 30)
    finally:
        for worker in workers:
            if worker.proc.poll() is None:
                worker.stop()
        if second is not None:
            second.stop()
        if first.proc.poll() is None:
            first.stop()
