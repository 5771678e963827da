"""What a trusted code bundle (a process worker started with --trust-code) can no longer do,
through a real API, agent and jobs: make the agent upload a host file by linking its
checkpoint files to it; leave a daemon behind (setsid, double fork) that rewrites the
result of the next run, another submitter's; reach a warm interpreter (there is none)."""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.code_wheels import hostile_bundle, ring_spec
from tests.integration.service_procs import Service, WorkerProc, trusting_service
from tests.integration.test_code_bundles import pushed_digest

pytestmark = pytest.mark.slow

BLOBS = """
name: blobs-after-a-bundle
seed: 9
dataset: {generator: gaussian_blobs, params: {num_features: 4, num_classes: 2},
          batch_size: 16, train_batches: 4}
model: {architecture: mlp, params: {hidden: [8]}}
training:
  epochs: 2
  optimizer: {name: adam, params: {learning_rate: 0.01}}
  loss: {name: sparse_categorical_crossentropy, params: {from_logits: true}}
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with trusting_service(tmp_path_factory.mktemp("trusted")) as svc:
        yield svc


def run_of(service: Service, spec: str, client: Any = None) -> dict[str, Any]:
    created = (client or service.client).post(
        "/api/v1/experiments", content=spec, headers={"content-type": "application/yaml"}
    )
    assert created.status_code == 201, created.text
    return service.wait_run(int(created.json()["run"]["id"]), timeout=300)


def stored_bytes(service: Service) -> bytes:
    """Everything the server keeps on disk (artifacts, database), concatenated."""
    files = sorted(p for p in service.data_dir.rglob("*") if p.is_file())
    return b"".join(p.read_bytes() for p in files)


def assert_linked_checkpoints_refused(service: Service, tmp_path: Path) -> None:
    """A bundle links its checkpoint files to a host file and announces a checkpoint: the
    run fails saying why, and not a byte of the host file reaches the server."""
    secret = secrets.token_hex(16).encode()
    host_file = tmp_path / "host-secret"
    host_file.write_bytes(secret * 64)
    host_file.chmod(0o600)
    body = hostile_bundle("linked_rings", str(host_file))
    run = run_of(service, ring_spec(pushed_digest(service.client, body, name="linked")))
    assert run["status"] == "failed", run
    assert run["error"]["type"] == "UnsafeJobFile", run["error"]
    assert "step-000000001.npz is a symbolic link" in run["error"]["message"]
    artifacts = service.client.get(f"/api/v1/runs/{run['id']}/artifacts").json()
    assert [a for a in artifacts if a["name"].startswith("step-")] == []
    assert secret not in stored_bytes(service)


def test_checkpoint_links_to_a_host_file_are_refused(service: Service, tmp_path: Path) -> None:
    assert_linked_checkpoints_refused(service, tmp_path)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_bundle_s_daemon_dies_with_its_job_and_cannot_forge_the_next_result(
    service: Service, tmp_path: Path
) -> None:
    marker = tmp_path / "daemon-pid"
    body = hostile_bundle("daemon_rings", str(marker))
    first = run_of(service, ring_spec(pushed_digest(service.client, body, name="daemon")))
    # Its own daemon rewrites this run's own result too (killed mid-write it leaves it empty):
    # a bundle's code speaks for its own run. What it must not reach is anyone else's.
    assert first["status"] in ("succeeded", "failed"), first
    daemon = int(marker.read_text())
    try:
        # Reported only once every process of the job is gone, the escaped daemon included.
        assert not _alive(daemon), f"the bundle's daemon {daemon} outlived its job"
    except AssertionError:
        os.kill(daemon, signal.SIGKILL)  # leave nothing running after the test
        raise

    other = service.client_for("submitter", "someone-else")
    second = run_of(service, BLOBS, client=other)
    assert second["status"] == "succeeded", second["error"]
    losses = [v for epoch in second["metrics"] for k, v in epoch.items() if k.endswith("loss")]
    assert losses and 0.001 not in losses, second["metrics"]


def _warm_children(pid: int) -> list[int]:
    """The warm interpreters among a process's children."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if ppid == pid and b"worker.training.warm_run" in cmdline:
            found.append(int(proc.name))
    return found


def test_no_warm_interpreter_while_code_is_trusted(service: Service, tmp_path: Path) -> None:
    def agent(name: str, *extra: str) -> WorkerProc:
        token = service.token("worker", name)
        return WorkerProc(
            service.url, tmp_path / name, token=token, name=name, extra=extra, warm_start=True
        )

    plain, trusting = agent("plain"), agent("trusting", "--trust-code")
    try:
        plain.worker_id()
        trusting.worker_id()
        deadline = time.monotonic() + 60
        while not _warm_children(plain.proc.pid):  # without --trust-code, one starts idle
            assert time.monotonic() < deadline, plain.log.read_text()
            time.sleep(0.1)
        # Started at the same time, the trusting agent has had as long to start one.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert _warm_children(trusting.proc.pid) == []
            time.sleep(0.1)
        assert "warm starts are off" in trusting.log.read_text()
    finally:
        plain.stop()
        trusting.stop()
