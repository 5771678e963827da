"""The one-box compose stack, started for real from the locally built images.

PostgreSQL, the object store, the migration step, two API replicas behind a proxy on one
port and a worker with the Docker executor (each job in a fresh container of the CPU worker
image) come up from deploy/compose/compose.yaml through deploy/compose/stack.sh, without a
terminal: its settings file gets a generated database password and store key once and keeps
them; a password exported over it is refused; a submitted spec and its rerun (asked and
trained with one replica stopped) end `identical`, their files in the object store and none
in the API's volume; the image the engine ran is recorded as the run's image;
`down --volumes` then leaves no container, volume, network or workspace file behind.
"""

from __future__ import annotations

import hashlib
import os
import re
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

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "deploy" / "compose" / "stack.sh"
SPEC = ROOT / "examples" / "seed001.yaml"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGES = {
    "api": f"reprotrain-api:{VERSION}",
    "worker": f"reprotrain-worker-cpu:{VERSION}",
    "postgres": "reprotrain-postgres:15",
    "s3": "reprotrain-s3:4.48",
    "proxy": "reprotrain-proxy:2.6",
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
    """`deploy/compose/stack.sh` with this test's settings file and no terminal."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.env = {**env, "REPRO_COMPOSE": " ".join(command)}

    def __call__(
        self, *args: str, timeout: float = 300, **more_env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(STACK), *args],
            env={**self.env, **more_env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _settings(env_file: Path) -> dict[str, str]:
    lines = env_file.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


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
    engine: Any, workspace: Path, tmp_path: Path
) -> None:
    project = f"reprotrain-test-{secrets.token_hex(4)}"
    port, s3_port = free_port(), free_port()
    # The operator's own settings; stack.sh adds the password, the socket's group, the files.
    env_file = tmp_path / "stack.env"
    env_file.write_text(
        f"COMPOSE_PROJECT_NAME={project}\nREPRO_API_PORT={port}\nREPRO_WORKSPACE={workspace}\n"
        f"REPRO_API_IMAGE={IMAGES['api']}\nREPRO_WORKER_IMAGE={IMAGES['worker']}\n"
        f"REPRO_JOB_IMAGE={IMAGES['worker']}\nREPRO_POSTGRES_IMAGE={IMAGES['postgres']}\n"
        f"REPRO_S3_IMAGE={IMAGES['s3']}\nREPRO_S3_PORT={s3_port}\n"
        f"REPRO_PROXY_IMAGE={IMAGES['proxy']}\n"
        f"REPRO_S3_PUBLIC_URL=http://127.0.0.1:{s3_port}\n"
    )
    env = {**os.environ, "REPRO_COMPOSE_ENV_FILE": str(env_file)}
    for name in ("REPRO_EXECUTOR", "REPRO_WORKER_ARGS", "REPRO_POSTGRES_PASSWORD"):
        env.pop(name, None)  # the stack as shipped: the Docker executor
    stack = Stack(_compose_command(), env)
    worker_image_id = engine.images.get(IMAGES["worker"]).id
    worker_host = ""
    try:
        up = stack("up", timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        written = _settings(env_file)
        password = written["REPRO_POSTGRES_PASSWORD"]
        assert re.fullmatch(r"[0-9a-f]{32}", password)  # URL-safe as it is
        assert re.fullmatch(r"[0-9a-f]{32}", written["REPRO_S3_SECRET_KEY"])
        assert written["COMPOSE_PROJECT_NAME"] == project and written["REPRO_API_PORT"] == str(port)
        assert env_file.stat().st_mode & 0o077 == 0
        want_gid = str(SOCKET.stat().st_gid) if SOCKET.exists() else "0"
        assert written["REPRO_DOCKER_GID"] == want_gid
        # Run again (as the quick start is): the password is kept, the database still opens.
        again = stack("up", timeout=600)
        assert again.returncode == 0, again.stdout + again.stderr
        assert _settings(env_file)["REPRO_POSTGRES_PASSWORD"] == password
        # A new password exported over the kept one would lock the API out: refused.
        before = env_file.read_text()
        clash = stack("ps", REPRO_POSTGRES_PASSWORD="another-password")
        assert clash.returncode == 2 and "REPRO_POSTGRES_PASSWORD" in clash.stderr
        assert env_file.read_text() == before
        # The worker's hostname (its container's short ID) labels the job containers it starts.
        worker_host = engine.containers.get(stack("ps", "-q", "worker").stdout.strip()).attrs[
            "Config"
        ]["Hostname"]
        token = stack("admin-token")
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
            # One replica stops: the same port answers through the other, at once, and the
            # worker trains the rerun through it.
            stopped = stack("stop", "api-1")
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            rerun = api.post(f"/api/v1/runs/{first['id']}/rerun")
            assert rerun.status_code == 202, rerun.text
            second = _wait_run(api, rerun.json()["id"])
            assert "api-2" in stack("ps", "--services", "--filter", "status=running").stdout
        assert second["status"] == "succeeded", (second.get("error"), stack("logs").stdout)
        assert stack("start", "api-1").returncode == 0
        assert second["verdict"] == "identical"
        assert second["final_fingerprint"] == first["final_fingerprint"]
        # The weights went to the object store, by presigned URL; a download from the host
        # is sent to the store's published port, and the bytes are the recorded ones.
        assert "object store by presigned URL" in stack("logs", "worker").stdout
        assert not stack(
            "exec", "-T", "api-2", "find", "/var/lib/reprotrain", "-name", "*.npz"
        ).stdout
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth, timeout=30) as api:
            arts = api.get(f"/api/v1/runs/{first['id']}/artifacts").json()
            npz = next(a for a in arts if a["name"].endswith(".npz"))
            sent = api.get(f"/api/v1/artifacts/{npz['id']}")
        assert sent.status_code == 307
        assert sent.headers["location"].startswith(f"http://127.0.0.1:{s3_port}/reprotrain/")
        got = httpx.get(sent.headers["location"], timeout=30)
        assert hashlib.sha256(got.content).hexdigest() == npz["sha256"]
        # The image identity the engine ran is provenance, for both runs.
        assert first["provenance"]["image"]["id"] == worker_image_id
        assert second["provenance"]["image"]["id"] == worker_image_id
        assert any(workspace.iterdir())  # the runs' workspaces, written by the jobs
    finally:
        down = stack("down", "--volumes", timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert list(workspace.iterdir()) == []
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
