"""Gangs through the service: worker agents on 127.0.0.1 (process executor) that join
multi-host runs (`--gang-address`), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import blobs_spec
from tests.integration.service_procs import Service, WorkerProc

pytestmark = pytest.mark.slow

GANG = {"REPRO_WORKER_GANG_ADDRESS": "127.0.0.1"}


@pytest.fixture
def service(database_url: str | None, tmp_path: Path) -> Iterator[Service]:
    env = {"REPRO_LEASE_SECONDS": "8", "REPRO_HEARTBEAT_SECONDS": "2"}
    svc = Service(tmp_path / "data", database_url=database_url, env=env, extra=("--no-demo",))
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


def _spec(
    hosts: int, batches: int = 6, replicas: int = 1, batch_size: int = 24, **training: Any
) -> str:
    base = blobs_spec()
    shards = 2 if hosts < 3 else 3
    dataset = {"shards": shards, "batch_size": batch_size, "train_batches": batches}
    spec = blobs_spec(
        name=f"gang-{hosts}",
        dataset={**base["dataset"], **dataset},
        training={**base["training"], **training},
        distribution={"hosts": hosts, "replicas": replicas},
    )
    return json.dumps(spec)


def _submit(service: Service, spec: str) -> int:
    created = service.submit(spec, "application/json")
    assert created.status_code == 201, created.text
    return int(created.json()["run"]["id"])


def _agents(service: Service, root: Path, count: int) -> list[WorkerProc]:
    agents = [service.worker(root / f"agent{i}", env=GANG) for i in range(count)]
    for a in agents:
        a.worker_id()
    return agents


def test_a_gang_of_two_trains_and_reruns_identically_and_one_of_three_never_holds_them(
    service: Service, tmp_path: Path
) -> None:
    agents = _agents(service, tmp_path, 2)
    try:
        # Three hosts with two agents: it never forms, and holds neither agent.
        three = _submit(service, _spec(3))
        # Two logical CPU devices on each (the agents allow one per core, 2 here).
        first = _submit(service, _spec(2, replicas=2))
        done = service.wait_run(first)
        assert done["status"] == "succeeded", done["error"]
        assert done["provenance"]["determinism"]["distribution"]["replicas"] == 2
        gang = done["provenance"]["gang"]
        assert [m["rank"] for m in gang] == [0, 1]
        assert len({m["worker_id"] for m in gang}) == 2
        assert done["worker_id"] == gang[0]["worker_id"]  # rank 0 reports the run

        rerun = service.client.post(f"/api/v1/runs/{first}/rerun")
        assert rerun.status_code == 202, rerun.text
        again = service.wait_run(int(rerun.json()["id"]))
        assert again["status"] == "succeeded", again["error"]
        assert again["verdict"] == "identical"
        assert again["final_fingerprint"] == done["final_fingerprint"]

        waiting = service.client.get(f"/api/v1/runs/{three}").json()
        assert waiting["status"] == "queued" and waiting["attempt"] == 0
        assert "trains on 3 workers" in waiting["waiting_reason"]
        # Neither agent is held by it: a one-host run is taken at once.
        single = json.loads(_spec(2, replicas=2))
        single.update(distribution={"hosts": 1, "replicas": 2})
        one_id = _submit(service, json.dumps(single))
        one = service.wait_run(one_id, timeout=120)
        assert one["status"] == "succeeded", one["error"]
        assert service.client.get(f"/api/v1/runs/{three}").json()["status"] == "queued"
        # One host against two, the same global batches: equal data, weights measured apart.
        report = service.client.get("/api/v1/compare", params={"a": one_id, "b": first}).json()
        assert report["spec_diff"] == [{"path": "distribution.hosts", "a": 1, "b": 2}]
        assert report["data"]["equal"] is True and report["data_epochs_differing"] == []
        assert report["verdict"] == "diverged" and report["cause"] == "compute"
        measured = [d for d in report["differences"] if d["max_abs_diff"] is not None]
        assert measured and all(d["max_abs_diff"] > 0 for d in measured)
        service.client.post(f"/api/v1/runs/{three}/cancel")
    finally:
        for a in agents:
            a.stop()


def _jobs(agents: dict[int, WorkerProc]) -> dict[int, int]:
    """Of `agents` (by worker id), those running a job: worker id -> the job's pid (the
    innermost descendant running worker.run, if a job re-executed itself)."""
    parents: dict[int, int] = {}
    commands: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    worker_of = {agent.proc.pid: worker for worker, agent in agents.items()}
    jobs: dict[int, int] = {}
    for pid, command in commands.items():
        if b"worker.run" not in command:
            continue
        up = pid
        while up > 1 and up not in worker_of:
            up = parents.get(up, 0)
        if up in worker_of:
            jobs[worker_of[up]] = max(pid, jobs.get(worker_of[up], 0))
    return jobs


def test_a_killed_member_ends_the_attempt_and_a_new_gang_resumes_identically(
    service: Service, tmp_path: Path
) -> None:
    # Long enough (450 steps of 120 rows) that the kill lands while both members train.
    spec = _spec(2, batches=150, batch_size=120, epochs=3, checkpoint_every_steps=10)
    agents = _agents(service, tmp_path, 3)
    by_id = {a.worker_id(): a for a in agents}
    try:
        run_id = _submit(service, spec)
        deadline = time.monotonic() + 180
        while True:
            run = service.client.get(f"/api/v1/runs/{run_id}").json()
            if (run["checkpoint_step"] or 0) >= 10 and run["status"] == "running":
                # Members are told by their jobs and the run's holder (rank 0): an agent's
                # log may name a rank of an earlier gang of the run.
                jobs = _jobs(by_id)
                others = [pid for w, pid in jobs.items() if w != run["worker_id"]]
                if run["worker_id"] in jobs and others:
                    member = others[0]
                    break
            assert run["status"] in ("queued", "running"), run
            assert time.monotonic() < deadline, run
            time.sleep(0.2)
        os.kill(member, signal.SIGKILL)  # a host lost mid-epoch
        done = service.wait_run(run_id, timeout=300)
        assert done["status"] == "succeeded", done["error"]
        assert done["attempt"] >= 2
        assert done["result_summary"]["resumed_from_step"] is not None
        # An uninterrupted run of the same spec ends with the same bits.
        rerun = service.client.post(f"/api/v1/runs/{run_id}/rerun").json()
        straight = service.wait_run(int(rerun["id"]), timeout=300)
        assert straight["verdict"] == "identical", straight.get("verdict_report")
        assert straight["final_fingerprint"] == done["final_fingerprint"]
    finally:
        for a in agents:
            a.stop()
