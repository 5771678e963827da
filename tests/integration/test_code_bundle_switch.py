"""`REPRO_ALLOW_CODE_BUNDLES=false` turns code bundles off everywhere, against a real
`repro serve` on SQLite and PostgreSQL: a bundle run queued while bundles were allowed is
not claimed once they are off, even by a worker that accepts code, and says why; the
dashboard's rerun of it is refused and queues nothing."""

from __future__ import annotations

import time
from pathlib import Path

from tests.code_wheels import ring_bundle, ring_spec
from tests.integration.asgi_browser import hidden_value
from tests.integration.service_procs import Service, WorkerProc
from tests.integration.test_code_bundles import pushed_digest

OFF = {"REPRO_ALLOW_CODE_BUNDLES": "false", "REPRO_LEASE_SECONDS": "30"}


def _queued_bundle_run(data_dir: Path, database_url: str | None) -> int:
    """A run of a code bundle, submitted while bundles are allowed and left queued."""
    on = Service(data_dir, database_url=database_url, extra=("--no-demo",)).wait_ready()
    try:
        digest = pushed_digest(on.client, ring_bundle())
        created = on.submit(ring_spec(digest))
        assert created.status_code == 201, created.text
        return int(created.json()["run"]["id"])
    finally:
        on.stop()


def _run_ids(svc: Service) -> list[int]:
    return [run["id"] for run in svc.client.get("/api/v1/runs").json()["items"]]


def test_switched_off_bundles_are_not_claimed_nor_rerun(
    tmp_path: Path, database_url: str | None
) -> None:
    run_id = _queued_bundle_run(tmp_path / "data", database_url)
    off = Service(tmp_path / "data", database_url=database_url, env=OFF, extra=("--no-demo",))
    off.wait_ready()
    try:
        trusting = WorkerProc(
            off.url,
            tmp_path / "trusting",
            token=off.token("worker", "trusting"),
            name="trusting",
            extra=("--trust-code",),
        )
        try:
            trusting.worker_id()
            time.sleep(2)  # it polls every 0.2 s: it would have claimed a run it may take
            run = off.client.get(f"/api/v1/runs/{run_id}").json()
        finally:
            trusting.stop()
        assert run["status"] == "queued", run
        assert "code bundles are turned off on this server" in run["waiting_reason"]
        assert "REPRO_ALLOW_CODE_BUNDLES=false" in run["waiting_reason"]
        assert "no live worker accepts code" not in run["waiting_reason"]

        before = _run_ids(off)
        browser = off.dashboard()
        csrf = hidden_value(browser.get(f"/runs/{run_id}").text, "csrf")
        refused = browser.post(f"/runs/{run_id}/rerun", data={"csrf": csrf})
        assert refused.status_code == 422, refused.text
        assert "code bundles are turned off on this server" in refused.text
        assert _run_ids(off) == before
        api = off.client.post(f"/api/v1/runs/{run_id}/rerun")
        assert api.status_code == 422 and "REPRO_ALLOW_CODE_BUNDLES" in api.text
        assert _run_ids(off) == before
    finally:
        off.stop()
