"""Warm starts of the process executor, and jobs started with their determinism environment.

A job handed to an interpreter the agent started while idle trains the same bits and
records the same provenance (timings aside) as one started cold; a spec needing another
start-up environment is started cold; a warm interpreter that died is replaced; a stopped
agent leaves no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import blobs_spec, job_request
from tests.integration.service_procs import Service, WorkerProc
from worker.node.executors.process import ProcessExecutor
from worker.training.progress import parse_line

pytestmark = pytest.mark.slow

READY_SECONDS = 300.0  # a loaded machine imports TensorFlow slowly


def _run(executor: ProcessExecutor, workdir: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Start a job through the executor and follow it to its end: its result, how it started
    and the environment its process runs with."""
    request = job_request(workdir, spec, workdir.name, None)
    handle = executor.start(request)
    environ: dict[str, str] = {}
    try:
        for line in handle.stderr_lines():
            event = parse_line(line)
            if event is not None and event["event"] == "started":
                environ = _environ_of(handle.pid)
        code = handle.wait()
    finally:
        handle.close()
    result: dict[str, Any] = json.loads(request.result_path.read_text())
    assert code == 0 and result["status"] == "succeeded", result.get("error")
    return {"result": result, "warm": handle.warm, "environ": environ}


def _environ_of(pid: int) -> dict[str, str]:
    """The environment a process was (last) executed with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (entry.partition(b"=") for entry in raw.split(b"\0") if entry)
    return {name.decode(): value.decode() for name, _, value in pairs}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _untimed(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in epoch.items() if k != "seconds"} for epoch in metrics]


def _without_timings(provenance: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in provenance.items() if k != "captured_at" and "timing" not in k}


def test_a_warm_started_job_equals_a_cold_started_one_bit_for_bit(tmp_path: Path) -> None:
    spec = blobs_spec()
    cold = _run(ProcessExecutor(warm_start=False), tmp_path / "cold", spec)
    warm_executor = ProcessExecutor()
    warm_executor.prepare()
    assert warm_executor.wait_warm(READY_SECONDS)
    warm = _run(warm_executor, tmp_path / "warm", spec)
    assert (cold["warm"], warm["warm"]) == (False, True)
    a, b = cold["result"], warm["result"]
    for field in (
        "final_fingerprint",
        "trace",
        "data_fingerprints",
        "eval_data_fingerprint",
        "determinism",
        "spec_hash",
    ):
        assert a[field] == b[field], field
    assert _untimed(a["metrics"]) == _untimed(b["metrics"])
    assert _without_timings(a["provenance"]) == _without_timings(b["provenance"])
    # Neither re-executed itself: both were started with what the spec's determinism needs.
    for job in (cold, warm):
        assert "REPRO_JOB_REEXEC" not in job["environ"]
        assert job["environ"]["PYTHONHASHSEED"] == "0"
    assert warm_executor.warm_pid() is None  # handed over: the next one starts when idle


def test_a_job_starts_with_its_spec_s_determinism_environment(tmp_path: Path) -> None:
    spec = blobs_spec(determinism={"python_hash_seed": 7, "intra_op_threads": 1})
    spec["training"]["epochs"] = 1
    job = _run(ProcessExecutor(warm_start=False), tmp_path / "job", spec)
    assert "REPRO_JOB_REEXEC" not in job["environ"]  # no second interpreter start
    assert job["environ"]["PYTHONHASHSEED"] == "7"
    assert job["environ"]["OMP_NUM_THREADS"] == "1"
    assert job["result"]["determinism"]["intra_op_threads"] == 1


def test_another_startup_environment_starts_cold_then_warm_for_the_next(tmp_path: Path) -> None:
    spec = blobs_spec(determinism={"python_hash_seed": 7})
    spec["training"]["epochs"] = 1
    executor = ProcessExecutor()
    try:
        executor.prepare()  # started with the default determinism's environment
        first_warm = executor.warm_pid()
        assert first_warm is not None
        first = _run(executor, tmp_path / "first", spec)
        assert not first["warm"] and not _alive(first_warm)  # discarded, reaped
        # The next interpreter is started with what the last job needed.
        executor.prepare()
        assert executor.wait_warm(READY_SECONDS)
        second = _run(executor, tmp_path / "second", spec)
        assert second["warm"]
        assert second["result"]["final_fingerprint"] == first["result"]["final_fingerprint"]
        assert second["environ"]["PYTHONHASHSEED"] == "7"
    finally:
        executor.discard_warm()


def test_a_dead_warm_interpreter_is_replaced_and_its_job_starts_cold(tmp_path: Path) -> None:
    spec = blobs_spec()
    spec["training"]["epochs"] = 1
    executor = ProcessExecutor()
    try:
        executor.prepare()
        dead = executor.warm_pid()
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _alive(dead) and time.monotonic() < deadline:
            time.sleep(0.05)
        job = _run(executor, tmp_path / "job", spec)
        assert not job["warm"]
        executor.prepare()
        executor.prepare()  # one is enough: prepare keeps a live one
        replacement = executor.warm_pid()
        assert replacement not in (None, dead) and _alive(replacement)
        os.kill(replacement, signal.SIGKILL)
        while _alive(replacement) and time.monotonic() < deadline + 30:
            time.sleep(0.05)
        executor.prepare()  # a warm interpreter that died while idle is replaced
        last = executor.warm_pid()
        assert last not in (None, replacement)
    finally:
        executor.discard_warm()
    assert last is not None and not _alive(last)


def test_a_code_bundle_never_runs_in_a_warm_interpreter(tmp_path: Path) -> None:
    # A worker that trusts bundles keeps no warm interpreter at all (tested through the
    # command line in test_trusted_code_containment); should a bundle run reach one that
    # does, it is still never handed over.
    executor = ProcessExecutor()
    try:
        executor.prepare()
        warm = executor._warm
        assert warm is not None
        request = job_request(tmp_path / "job", blobs_spec(), "job", None)
        env = {**warm.env}
        assert warm.fits(env, request)
        bundled = job_request(
            tmp_path / "bundled", blobs_spec(), "bundled", None, code_file=tmp_path / "x.whl"
        )
        assert not warm.fits(env, bundled)
        assert not warm.fits({**env, "PYTHONHASHSEED": "3"}, request)
        assert warm.fits({**env, "REPRO_EXPORT_MODEL": str(tmp_path / "m.keras")}, request)
    finally:
        executor.discard_warm()


def test_an_agent_starts_its_job_warm_and_leaves_nothing_behind_on_sigterm(
    tmp_path: Path,
) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",)).wait_ready()
    work_dir = tmp_path / "worker"
    worker = WorkerProc(
        service.url,
        work_dir,
        token=service.token("worker", "w"),
        warm_start=True,
    )
    try:
        worker.worker_id()
        spec = blobs_spec()
        spec["training"]["epochs"] = 1
        run_id = service.submit(json.dumps(spec), "application/json").json()["run"]["id"]
        done = service.wait_run(run_id, timeout=600)
        assert done["status"] == "succeeded", done["error"]
        assert "handed to warm interpreter" in worker.log.read_text()
        # Idle again: the next job's interpreter is waiting.
        deadline = time.monotonic() + 60
        while not _children(worker.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        waiting = _children(worker.proc.pid)
        assert waiting, worker.log.read_text()
        worker.signal(signal.SIGTERM)
        assert worker.proc.returncode == 0, worker.log.read_text()
        assert not any(_alive(pid) for pid in waiting)
    finally:
        worker.stop()
        service.stop()


def test_no_warm_start_keeps_no_interpreter_waiting(tmp_path: Path) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",)).wait_ready()
    worker = WorkerProc(
        service.url,
        tmp_path / "worker",
        token=service.token("worker", "w"),
        warm_start=False,  # as `--no-warm-start`
    )
    try:
        worker.worker_id()
        time.sleep(1.0)  # a warm interpreter would be started right after registering
        assert _children(worker.proc.pid) == []
        worker.signal(signal.SIGTERM)
        assert worker.proc.returncode == 0
    finally:
        worker.stop()
        service.stop()
