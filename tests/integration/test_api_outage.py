"""Training never stops because the API is away: the API is SIGKILLed mid-training and stays
down for three lease lengths; the worker trains on, and once the API is back on the same
database and port the run finishes on its first attempt, with every epoch's checkpoint
uploaded and its rerun identical. Once with a job that ends while the API is down (its
checkpoints and result wait in the outbox), once with one that trains on after the API is
back (the agent's heartbeats renew the lease). Real `repro serve`, a real worker, real
TensorFlow."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.integration.jobs import blobs_spec
from tests.integration.service_procs import Service

pytestmark = pytest.mark.slow

LEASE = 2.0
ENV = {"REPRO_LEASE_SECONDS": str(LEASE), "REPRO_HEARTBEAT_SECONDS": "1"}


@pytest.mark.parametrize(
    ("epochs", "api_back"),
    # An epoch of this spec takes about 0.3 s once the job has started.
    [(8, "after the job ends"), (100, "while the job trains")],
    ids=["outbox", "renewed"],
)
def test_a_run_finishes_on_its_attempt_through_an_api_outage(
    tmp_path: Path, epochs: int, api_back: str
) -> None:
    dataset = {**blobs_spec()["dataset"], "batch_size": 512, "train_batches": 160}
    spec = blobs_spec(dataset=dataset)
    spec["training"]["epochs"] = epochs
    first = Service(tmp_path / "data", env=ENV, extra=("--no-demo",)).wait_ready()
    worker = first.worker(tmp_path / "worker")
    second: Service | None = None
    try:
        run_id = first.submit(json.dumps(spec), "application/json").json()["run"]["id"]
        deadline = time.monotonic() + 240
        while (first.client.get(f"/api/v1/runs/{run_id}").json()["checkpoint_epoch"] or 0) < 1:
            assert time.monotonic() < deadline, "no checkpoint uploaded"
            time.sleep(0.1)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        first.stop()
        time.sleep(3 * LEASE)
        log = worker.log.read_text()
        assert "abandoned" not in log, log[-3000:]
        assert "the API does not answer" in log, log[-3000:]

        second = Service(tmp_path / "data", env=ENV, extra=("--no-demo",), port=first.port)
        second.wait_ready()
        done = second.wait_run(run_id)
        assert done["status"] == "succeeded", done["error"]
        assert done["attempt"] == 1  # the same attempt: nothing was requeued or retrained
        log = worker.log.read_text()
        if api_back == "while the job trains":
            assert "the API answers again" in log, log[-3000:]
        else:
            assert "kept to upload with the report" in log, log[-3000:]
        artifacts = second.client.get(f"/api/v1/runs/{run_id}/artifacts").json()
        uploaded = {a["epoch"] for a in artifacts if a["kind"] == "checkpoint"}
        assert set(range(1, epochs + 1)) <= uploaded, artifacts

        rerun = second.client.post(f"/api/v1/runs/{run_id}/rerun")
        assert rerun.status_code == 202, rerun.text
        again = second.wait_run(rerun.json()["id"])
        assert again["verdict"] == "identical", again["verdict_report"]
    finally:
        worker.stop()
        if second is not None:
            second.stop()
        first.stop()
