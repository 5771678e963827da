"""`repro worker --enroll`: an agent given the fleet's bootstrap token enrolls once, keeps
its own credential in its work directory (owner-only), trains with it, uses it again after
a restart, and once an admin revokes it stops with what to do. A real server, a real agent,
real TensorFlow."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from tests.integration.jobs import blobs_spec
from tests.integration.service_procs import Service, WorkerProc

pytestmark = pytest.mark.slow


def test_an_enrolled_agent_trains_with_its_own_credential_until_it_is_revoked(
    tmp_path: Path,
) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",)).wait_ready()
    bootstrap = service.token("worker", "fleet-bootstrap")
    work_dir = tmp_path / "agent"
    kept = work_dir / "credential.json"
    agent = None

    def start_agent() -> WorkerProc:
        return WorkerProc(
            service.url, work_dir, token=bootstrap, name="node-1", extra=("--enroll",)
        )

    try:
        agent = WorkerProc(
            service.url, work_dir, token=bootstrap, name="node-1", extra=("--enroll",)
        )
        first_id = agent.worker_id()
        assert "enrolled as worker" in agent.log.read_text()
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        credential = json.loads(kept.read_text())
        assert credential["name"] == "node-1" and credential["id"] == first_id

        spec = blobs_spec()
        spec["training"]["epochs"] = 1
        run_id = service.submit(json.dumps(spec), "application/json").json()["run"]["id"]
        done = service.wait_run(run_id)
        assert done["status"] == "succeeded", done["error"]
        # Reported with the worker's own credential, not the bootstrap token.
        assert done["reported_by"]["token_id"] == credential["credential_id"]
        agent.stop()

        # The bootstrap token is rotated away; the restarted agent uses its kept credential.
        tokens = service.client.get("/api/v1/tokens").json()
        boot_id = next(t["id"] for t in tokens if t["name"] == "fleet-bootstrap")
        assert service.client.post(f"/api/v1/tokens/{boot_id}/revoke").status_code == 200
        agent = WorkerProc(
            service.url, work_dir, token=bootstrap, name="node-1", extra=("--enroll",)
        )
        assert agent.worker_id() == first_id
        assert "enrolled as worker" not in agent.log.read_text()
        agent.stop()

        # An admin revokes this worker's credential: the agent says what to do, and stops.
        revoked = service.client.post(f"/api/v1/tokens/{credential['credential_id']}/revoke")
        assert revoked.status_code == 200, revoked.text
        agent = WorkerProc(
            service.url, work_dir, token=bootstrap, name="node-1", extra=("--enroll",)
        )
        try:
            code = agent.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the agent kept running: {agent.log.read_text()[-2000:]}")
        assert code == 2
        said = " ".join(agent.log.read_text().split())  # as one line, however it was wrapped
        assert "credential (revoked or expired)" in said and "removing" in said, said[-2000:]
    finally:
        if agent is not None:
            agent.stop()
        service.stop()
