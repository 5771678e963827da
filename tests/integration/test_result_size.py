"""A result the spec's own limits allow reaches the server; one that could not is refused at
submit; a worker whose result the API still refuses as too large says so on the run.

Real servers, real worker agents, real TensorFlow (tiny models).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import blobs_spec
from tests.integration.service_procs import Service

pytestmark = pytest.mark.slow


def _spec(*, train_batches: int, every: int | None = 1) -> str:
    spec = blobs_spec(name="per-step-trace")
    spec["dataset"] = {**spec["dataset"], "batch_size": 8, "train_batches": train_batches}
    spec["dataset"]["eval_batches"] = 0
    spec["model"]["params"] = {"hidden": [8, 8]}
    spec["training"]["epochs"] = 1
    spec["training"]["metrics"] = []
    if every is not None:
        spec["training"]["fingerprint_every_steps"] = every
    return json.dumps(spec)


def _result_file(work_dir: Path, run_id: int) -> Path:
    return work_dir / "runs" / str(run_id) / "attempt-1" / "result.json"


def _wait_for(what: str, condition: Any, seconds: float = 120) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


def test_a_700_step_trace_of_over_a_megabyte_is_delivered(tmp_path: Path) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",)).wait_ready()
    worker = None
    try:
        worker = service.worker(tmp_path / "worker")
        submitted = service.submit(_spec(train_batches=700), "application/json")
        assert submitted.status_code == 201, submitted.text
        run_id = submitted.json()["run"]["id"]
        done = service.wait_run(run_id, timeout=400)
        assert done["status"] == "succeeded", done["error"]
        assert done["attempt"] == 1
        # The worker's compact JSON body was past the general 1 MB body limit.
        result = json.loads(_result_file(tmp_path / "worker", run_id).read_text())
        assert len(json.dumps(result, separators=(",", ":"))) > 1_000_000
        assert len(done["trace"]) == len(result["trace"]) == 1 + 700 + 1
        assert done["final_fingerprint"] == result["final_fingerprint"]
    finally:
        if worker is not None:
            worker.stop()
        service.stop()


def test_a_spec_whose_result_could_not_be_delivered_is_refused_at_submit(tmp_path: Path) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",)).wait_ready()
    try:
        # 50,000 trace points (within the count a worker keeps) of 26 variables each: their
        # digests alone are past 64 MiB.
        refused = service.submit(_spec(train_batches=50_000), "application/json")
        assert refused.status_code == 422, refused.text
        errors = refused.json()["errors"]
        assert [e["loc"] for e in errors] == ["training.fingerprint_every_steps"]
        assert "REPRO_MAX_RESULT_BYTES" in errors[0]["msg"]
        assert service.client.get("/api/v1/runs").json()["items"] == []  # nothing stored
        # The same training traced every 1,000 steps is well within the bound.
        fine = service.submit(_spec(train_batches=50_000, every=1000), "application/json")
        assert fine.status_code == 201, fine.text
    finally:
        service.stop()


def test_a_result_the_api_refuses_as_too_large_fails_the_run_saying_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    service = Service(data, extra=("--no-demo",)).wait_ready()
    try:
        submitted = service.submit(_spec(train_batches=12), "application/json")
        assert submitted.status_code == 201, submitted.text
        run_id = submitted.json()["run"]["id"]
    finally:
        service.stop()
    # The operator lowers the limits after the spec was accepted: its ~30 KB result no
    # longer fits, and the worker (which reads a result only within the bound its claim
    # carries) can only tell the run why, keeping the document.
    limits = {"REPRO_MAX_BODY_BYTES": "16384", "REPRO_MAX_RESULT_BYTES": "16384"}
    service = Service(data, env=limits, extra=("--no-demo",)).wait_ready()
    work_dir = tmp_path / "worker"
    worker = None
    try:
        worker = service.worker(work_dir)
        done = service.wait_run(run_id)
        assert done["status"] == "failed"
        assert done["attempt"] == 1  # not five lease expiries
        assert done["error"]["type"] == "ResultTooLarge", done["error"]
        assert "too large" in done["error"]["message"]
        kept = work_dir / "outbox" / "refused" / f"run-{run_id}.result.json"
        assert str(kept) in done["error"]["message"]
        assert done["error"]["result_bytes"] == kept.stat().st_size > 16384
        assert json.loads(kept.read_text())["status"] == "succeeded"
        # Nothing left to send, once the failure report's answer reaches the agent.
        _wait_for("the outbox to empty", lambda: not list((work_dir / "outbox").glob("run-*")), 30)
    finally:
        if worker is not None:
            worker.stop()
        service.stop()
