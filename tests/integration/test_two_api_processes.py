"""Two `repro serve` processes on one PostgreSQL and one object store act as one service:
requests alternate between them, a run submitted on one trains through a worker of the
other and is watched live on the second; a file pushed to one downloads from the other;
a dashboard login link printed by one logs in on the other, and its session works on
both; a rerun asked of either ends `identical`."""

from __future__ import annotations

import hashlib
import io
import json
import re
import secrets
import threading
from pathlib import Path

import httpx
import numpy as np

from tests.integration.jobs import REPO
from tests.integration.service_procs import Service
from tests.object_store import S3Storage, s3_server, s3_storage

__all__ = ["s3_server", "s3_storage"]

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
LINK = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+)(/login\?code=\S+)")


def _watch(client: httpx.Client, run_id: int, seen: list[str]) -> None:
    """Follow the run's event stream until it ends, noting each status it reports."""
    with client.stream("GET", f"/api/v1/runs/{run_id}/events", timeout=600) as events:
        for line in events.iter_lines():
            if line.startswith("data:") and '"status"' in line:
                status = json.loads(line.removeprefix("data:"))["status"]
                if not seen or seen[-1] != status:
                    seen.append(status)


def test_two_api_processes_serve_as_one(
    tmp_path: Path, postgres_url: str, s3_storage: S3Storage
) -> None:
    shared = {
        **s3_storage.env,
        # What every API process of one service must share (README: replicas).
        "REPRO_DASHBOARD_SECRET": secrets.token_hex(32),
        "REPRO_PROVENANCE_KEY": secrets.token_hex(32),
    }
    one = Service(
        tmp_path / "one",
        database_url=postgres_url,
        env=shared,
        extra=("--no-demo", "--print-login-link"),
    )
    two: Service | None = None
    worker = None
    try:
        one.wait_ready()
        # The second process's operator holds an admin token of the same service.
        (tmp_path / "two").mkdir(mode=0o700)
        token_file = tmp_path / "two" / "admin-token"
        token_file.write_text(one.token("admin", "second-process") + "\n")
        token_file.chmod(0o600)
        two = Service(tmp_path / "two", database_url=postgres_url, env=shared, extra=("--no-demo",))
        two.wait_ready()
        apis = [one, two]
        worker = one.worker(tmp_path / "worker")
        worker.worker_id()

        # Submitted on one, watched live on the other while a worker of the first trains it.
        created = one.submit(SEED001)
        assert created.status_code == 201, created.text
        run_id = created.json()["run"]["id"]
        seen: list[str] = []
        watcher = threading.Thread(target=_watch, args=(two.client, run_id, seen))
        watcher.start()
        # Meanwhile requests alternate between the two.
        for i in range(20):
            got = apis[i % 2].client.get(f"/api/v1/runs/{run_id}")
            assert got.status_code == 200 and got.json()["id"] == run_id
        run = two.wait_run(run_id)
        watcher.join(timeout=120)
        assert not watcher.is_alive(), "the event stream on the other process did not end"
        assert run["status"] == "succeeded", run["error"]
        assert seen[-1] == "succeeded" and "running" in seen, seen

        # A rerun asked of the second, trained through the first's worker: identical.
        rerun = two.client.post(f"/api/v1/runs/{run_id}/rerun")
        assert rerun.status_code == 202, rerun.text
        second = one.wait_run(rerun.json()["id"])
        assert second["verdict"] == "identical", second["verdict_report"]

        # A dataset pushed to one downloads from the other, through the shared store.
        buf = io.BytesIO()
        np.savez(buf, x=np.arange(12, dtype=np.float32).reshape(6, 2), y=np.arange(6) % 2)
        data = buf.getvalue()
        digest = hashlib.sha256(data).hexdigest()
        pushed = one.client.post(
            "/api/v1/datasets",
            content=data,
            params={"name": "shared"},
            headers={"X-Content-SHA256": digest},
        )
        assert pushed.status_code == 201, pushed.text
        sent = two.client.get(f"/api/v1/datasets/sha256:{digest}/content")
        assert sent.status_code == 307
        assert hashlib.sha256(httpx.get(sent.headers["location"]).content).hexdigest() == digest

        # The login link the first printed logs in on the second; the session works on both.
        found = LINK.search(one.log.read_text())
        assert found, one.log.read_text()[-2000:]
        with httpx.Client(base_url=two.url, timeout=30) as browser:
            opened = browser.get(found.group(2))
            assert opened.status_code == 303, opened.text
            cookies = dict(browser.cookies)
            assert browser.get(f"/runs/{run_id}").status_code == 200
        with httpx.Client(base_url=one.url, timeout=30, cookies=cookies) as browser:
            assert browser.get(f"/runs/{run_id}").status_code == 200
        # Once used, on either process, the link works no more.
        for api in apis:
            with httpx.Client(base_url=api.url, timeout=30) as browser:
                assert browser.get(found.group(2)).status_code == 401
    finally:
        if worker is not None:
            worker.stop()
        if two is not None:
            two.stop()
        one.stop()
