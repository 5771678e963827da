"""The one-box compose stack, started for real from the locally built images.

PostgreSQL, the migration step, the API and a worker with the Docker executor (each job in
a fresh container of the CPU worker image) come up from deploy/compose/compose.yaml; a
submitted spec and its rerun end `identical`, the image the engine ran is recorded as the
run's image; `down -v` then leaves no container, volume or network behind.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.service_procs import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "compose" / "compose.yaml"
SPEC = ROOT / "examples" / "seed001.yaml"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGES = {
    "api": f"reprotrain-api:{VERSION}",
    "worker": f"reprotrain-worker-cpu:{VERSION}",
    "postgres": "reprotrain-postgres:15",
}
SOCKET = Path("/var/run/docker.sock")
RUN_TIMEOUT = 600.0  # one small training job, in a container, on a shared 2-core machine

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _engine() -> Any:
    """A client of the local Docker engine, or a skip saying what is missing."""
    try:
        import docker
    except ImportError:
        pytest.skip("the docker SDK is not installed (the project's 'docker' extra)")
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine reachable ({exc}); .ci/docker-deps.sh starts one")
    return client


def _compose_command() -> list[str]:
    """docker-compose v1, else the v2 plugin: the stack is written for both."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    docker_cli = shutil.which("docker")
    if (
        docker_cli
        and subprocess.run(
            [docker_cli, "compose", "version"], capture_output=True, check=False
        ).returncode
        == 0
    ):
        return [docker_cli, "compose"]
    pytest.skip("neither docker-compose nor the docker compose plugin is installed")


class Stack:
    """`compose -p NAME -f compose.yaml` with this test's environment."""

    def __init__(self, command: list[str], project: str, env: dict[str, str]) -> None:
        self.command, self.project, self.env = command, project, env

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.command, "-p", self.project, "-f", str(COMPOSE_FILE), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture
def engine() -> Any:
    client = _engine()
    missing = [tag for tag in IMAGES.values() if not client.images.list(name=tag)]
    if missing:
        pytest.skip(f"images not built: {missing} (run .ci/docker-deps.sh or docker/build.sh)")
    return client


@pytest.fixture
def workspace() -> Iterator[Path]:
    # Not under pytest's tmp_path: a bind-mount source must be a path the engine's host
    # sees, and the non-root worker (uid 10001) must be able to write it.
    path = Path(tempfile.mkdtemp(prefix="repro-compose-"))
    try:
        if os.geteuid() == 0:
            os.chown(path, 10001, 10001)
        else:
            path.chmod(0o777)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _wait_run(client: httpx.Client, run_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        run = client.get(f"/api/v1/runs/{run_id}").json()
        if run["status"] in ("succeeded", "failed", "cancelled"):
            return dict(run)
        time.sleep(2)
    raise AssertionError(f"run {run_id} did not finish within {RUN_TIMEOUT:.0f} s: {run}")


def test_compose_stack_trains_reruns_identically_and_leaves_nothing(
    engine: Any, workspace: Path
) -> None:
    project = f"reprotrain-test-{secrets.token_hex(4)}"
    port = free_port()
    env = {
        **os.environ,
        "REPRO_POSTGRES_PASSWORD": secrets.token_urlsafe(16),
        "REPRO_API_PORT": str(port),
        "REPRO_WORKSPACE": str(workspace),
        "REPRO_DOCKER_GID": str(SOCKET.stat().st_gid) if SOCKET.exists() else "0",
        "REPRO_API_IMAGE": IMAGES["api"],
        "REPRO_WORKER_IMAGE": IMAGES["worker"],
        "REPRO_JOB_IMAGE": IMAGES["worker"],
        "REPRO_POSTGRES_IMAGE": IMAGES["postgres"],
    }
    for name in ("REPRO_EXECUTOR", "REPRO_WORKER_ARGS"):
        env.pop(name, None)  # the stack as shipped: the Docker executor
    stack = Stack(_compose_command(), project, env)
    worker_image_id = engine.images.get(IMAGES["worker"]).id
    worker_host = ""
    try:
        up = stack("up", "-d", timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        # The worker's hostname (its container's short ID) labels the job containers it starts.
        worker_host = engine.containers.get(stack("ps", "-q", "worker").stdout.strip()).attrs[
            "Config"
        ]["Hostname"]
        token = stack("exec", "-T", "api", "cat", "/var/lib/reprotrain/admin-token")
        assert token.returncode == 0, token.stderr
        auth = {"Authorization": f"Bearer {token.stdout.strip()}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth, timeout=30) as api:
            created = api.post(
                "/api/v1/experiments",
                content=SPEC.read_bytes(),
                headers={"Content-Type": "application/yaml"},
            )
            assert created.status_code == 201, created.text
            first = _wait_run(api, created.json()["run"]["id"])
            assert first["status"] == "succeeded", (first.get("error"), stack("logs").stdout)
            rerun = api.post(f"/api/v1/runs/{first['id']}/rerun")
            assert rerun.status_code == 202, rerun.text
            second = _wait_run(api, rerun.json()["id"])
        assert second["status"] == "succeeded", (second.get("error"), stack("logs").stdout)
        assert second["verdict"] == "identical"
        assert second["final_fingerprint"] == first["final_fingerprint"]
        # The image identity the engine ran is provenance, for both runs.
        assert first["provenance"]["image"]["id"] == worker_image_id
        assert second["provenance"]["image"]["id"] == worker_image_id
    finally:
        down = stack("down", "-v", "--remove-orphans", "--timeout", "60", timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    label = f"com.docker.compose.project={project}"
    assert engine.containers.list(all=True, filters={"label": label}) == []
    assert engine.volumes.list(filters={"label": label}) == []
    assert engine.networks.list(filters={"label": label}) == []
    # Nor any job container the worker started.
    assert worker_host
    jobs = engine.containers.list(
        all=True, filters={"label": f"org.reprotrain.agent-host={worker_host}"}
    )
    assert jobs == []
