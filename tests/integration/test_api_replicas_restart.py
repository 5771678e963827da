"""A rolling restart of the API loses nothing: two `repro serve` replicas on one PostgreSQL
and one object store, behind HAProxy with the compose stack's configuration; four worker
agents (process executor, real TensorFlow) reach the API only through the proxy. While
twenty runs train, one replica stops for two lease lengths and comes back, then the other.
Training goes on through the replica that is up: every run succeeds on its first attempt
(each was claimed exactly once, so none was ever trained twice, at once or after), with
every epoch's checkpoint uploaded, and the four workers shared the work."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import httpx
import pytest

from tests.api_proxy import ApiProxy, need_haproxy
from tests.integration.jobs import blobs_spec
from tests.integration.service_procs import Service, WorkerProc
from tests.object_store import S3Storage, s3_server, s3_storage

__all__ = ["s3_server", "s3_storage"]

pytestmark = pytest.mark.slow

LEASE = 6.0
RUNS, WORKERS, EPOCHS = 20, 4, 5


def _progress(api: httpx.Client, run_ids: list[int]) -> tuple[int, int]:
    """(runs running, epochs checkpointed in all) as the API says through the proxy."""
    runs = [api.get(f"/api/v1/runs/{r}").json() for r in run_ids]
    running = sum(r["status"] == "running" for r in runs)
    return running, sum(r["checkpoint_epoch"] or 0 for r in runs)


def test_replicas_restarted_one_after_the_other_while_twenty_runs_train(
    tmp_path: Path, postgres_url: str, s3_storage: S3Storage
) -> None:
    need_haproxy()
    shared = {
        **s3_storage.env,
        # What every API process of one service must share (README: replicas).
        "REPRO_DASHBOARD_SECRET": secrets.token_hex(32),
        "REPRO_PROVENANCE_KEY": secrets.token_hex(32),
        "REPRO_LEASE_SECONDS": str(LEASE),
        "REPRO_HEARTBEAT_SECONDS": "1",
    }

    def replica(name: str, port: int | None = None) -> Service:
        svc = Service(
            tmp_path / name / "data",
            database_url=postgres_url,
            env=shared,
            extra=("--no-demo",),
            port=port,
        )
        try:  # a restart starts while four jobs share the cores: give it time
            return svc.wait_ready(timeout=120)
        except BaseException:
            svc.stop()  # not left running to fail another test with its open files
            raise

    replicas = {"one": replica("one")}
    # The second replica's operator holds an admin token of the same service.
    (tmp_path / "two" / "data").mkdir(parents=True, mode=0o700)
    token_file = tmp_path / "two" / "data" / "admin-token"
    token_file.write_text(replicas["one"].token("admin", "second-replica") + "\n")
    token_file.chmod(0o600)
    replicas["two"] = replica("two")
    proxy = ApiProxy(
        (f"127.0.0.1:{replicas['one'].port}", f"127.0.0.1:{replicas['two'].port}"),
        tmp_path / "haproxy.log",
    ).start()
    auth = {"Authorization": f"Bearer {replicas['one'].admin_token}"}
    api = httpx.Client(base_url=proxy.url, headers=auth, timeout=30)
    workers: list[WorkerProc] = []
    try:
        for i in range(WORKERS):
            name = f"w{i}"
            token = replicas["one"].token("worker", name)
            workers.append(WorkerProc(proxy.url, tmp_path / name, token=token, name=name))
        # Four jobs at once on two cores: the twenty runs outlast both restarts.
        dataset = {**blobs_spec()["dataset"], "batch_size": 512, "train_batches": 40}
        spec = blobs_spec(dataset=dataset)
        spec["training"]["epochs"] = EPOCHS
        run_ids = []
        for i in range(RUNS):
            body = json.dumps({**spec, "name": f"rolling-{i}", "seed": i})
            created = api.post(
                "/api/v1/experiments", content=body, headers={"content-type": "application/json"}
            )
            assert created.status_code == 201, created.text
            run_ids.append(created.json()["run"]["id"])

        deadline = time.monotonic() + 600
        while _progress(api, run_ids)[1] < 1:  # training has started
            assert time.monotonic() < deadline, "no checkpoint uploaded"
            time.sleep(0.5)
        for name in ("one", "two"):
            down = replicas[name]
            running, before = _progress(api, run_ids)
            assert running, f"nothing was training when {name} stopped"
            down.stop()  # SIGTERM, as a rolling update does
            time.sleep(2 * LEASE)
            # Runs trained and uploaded through the other replica meanwhile.
            assert _progress(api, run_ids)[1] > before, f"nothing moved while {name} was down"
            (down.log).rename(down.log.with_suffix(".before-restart.log"))
            replicas[name] = replica(name, port=down.port)

        finished = []
        for run_id in run_ids:
            deadline = time.monotonic() + 900
            while (run := api.get(f"/api/v1/runs/{run_id}").json())["status"] in (
                "queued",
                "running",
            ):
                assert time.monotonic() < deadline, f"run {run_id} still {run['status']}"
                time.sleep(0.5)
            finished.append(run)
        assert all(r["status"] == "succeeded" for r in finished), [r["error"] for r in finished]
        # Claimed exactly once each: no run was taken again, so none trained twice.
        assert [r["attempt"] for r in finished] == [1] * RUNS
        for run in finished:
            artifacts = api.get(f"/api/v1/runs/{run['id']}/artifacts").json()
            uploaded = {a["epoch"] for a in artifacts if a["kind"] == "checkpoint"}
            assert set(range(1, EPOCHS + 1)) <= uploaded, (run["id"], sorted(uploaded))
        assert len({r["worker_id"] for r in finished}) == WORKERS  # the work was shared
        assert len({r["final_fingerprint"] for r in finished}) == RUNS
        for worker in workers:
            log = worker.log.read_text()
            assert "lease lost" not in log and "abandon" not in log, log[-3000:]
    finally:
        for worker in workers:
            worker.stop()
        api.close()
        proxy.stop()
        for service in replicas.values():
            service.stop()
