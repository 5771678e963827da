"""Code bundles under the Docker executor, through a real API, agent and engine: a bundle's
generator and custom layer train in a locked-down container and a rerun is identical; the
provenance holds the bundle's digest and per-file manifest; a bundle that opens a network
connection at import fails inside the container saying so; a bundle that links its
checkpoint files to a host file fails without the agent reading that file.

Runs only where an engine answers and the worker image (REPRO_TEST_WORKER_IMAGE) can
install bundles; skips saying why otherwise.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.code_wheels import make_wheel, ring_bundle, ring_spec
from tests.integration.service_procs import Service, service_with_worker
from tests.integration.test_code_bundles import pushed_digest
from tests.integration.test_trusted_code_containment import assert_linked_checkpoints_refused

docker = pytest.importorskip("docker", reason="the docker SDK is not installed (.[docker])")

pytestmark = [pytest.mark.docker, pytest.mark.slow]

IMAGE = os.environ.get("REPRO_TEST_WORKER_IMAGE", "reprotrain-worker-cpu:0.1.0")
NETWORK_AT_IMPORT = b"""\
import socket

socket.create_connection(("192.0.2.1", 80), timeout=5)
"""


def worker_image_with(module: str, feature: str) -> Iterator[str]:
    """The id of the worker image (REPRO_TEST_WORKER_IMAGE) if an engine answers and the
    image imports `module`; a skip saying which is missing otherwise."""
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine is reachable ({exc})")
    try:
        image = client.images.get(IMAGE)
        client.containers.run(
            image.id, entrypoint=["python3", "-c", f"import {module}"], remove=True
        )
    except docker.errors.ImageNotFound:
        pytest.skip(f"image {IMAGE} is not built (docker/build.sh --base IMAGE cpu)")
    except docker.errors.ContainerError:
        pytest.skip(f"image {IMAGE} predates {feature}: rebuild it (docker/build.sh cpu)")
    try:
        yield str(image.id)
    finally:
        client.close()


@pytest.fixture(scope="module")
def image_id() -> Iterator[str]:
    yield from worker_image_with("worker.models.code_bundles", "code bundles")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, image_id: str) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("code-docker")
    with service_with_worker(
        root,
        "--executor", "docker", "--image", IMAGE, "--memory", "1g",
        name=f"docker-{root.name}",
        env={"REPRO_LEASE_SECONDS": "20"},
    ) as svc:  # fmt: skip
        yield svc


def run_of(service: Service, spec: str) -> dict[str, Any]:
    created = service.submit(spec)
    assert created.status_code == 201, created.text
    return service.wait_run(int(created.json()["run"]["id"]), timeout=300)


def test_bundle_trains_in_a_container_and_reruns_identical(service: Service) -> None:
    body = ring_bundle()
    digest = pushed_digest(service.client, body)
    first = run_of(service, ring_spec(digest))
    assert first["status"] == "succeeded", first["error"]
    code = first["provenance"]["code"]
    assert code["digest"] == digest
    model_py = hashlib.sha256(
        __import__("zipfile").ZipFile(__import__("io").BytesIO(body)).read("ring_bundle/model.py")
    ).hexdigest()
    assert code["files"]["ring_bundle/model.py"] == model_py
    rerun = service.client.post(f"/api/v1/runs/{first['id']}/rerun")
    assert rerun.status_code == 202, rerun.text
    second = service.wait_run(int(rerun.json()["id"]), timeout=300)
    assert second["status"] == "succeeded", second["error"]
    assert second["final_fingerprint"] == first["final_fingerprint"]
    assert second["verdict"] == "identical"


def test_bundle_that_opens_a_connection_at_import_fails_saying_so(service: Service) -> None:
    body = make_wheel(
        {"ring_bundle/__init__.py": b"", "ring_bundle/data.py": NETWORK_AT_IMPORT},
        entry_points="[reprotrain.generators]\ntest_rings = ring_bundle.data:rings\n"
        "[reprotrain.architectures]\ntest_ring_mlp = ring_bundle.data:rings\n",
    )
    run = run_of(service, ring_spec(pushed_digest(service.client, body)))
    assert run["status"] == "failed"
    message = run["error"]["message"]
    assert "failed at import" in message and "ring_bundle.data" in message
    assert "OSError" in message or "unreachable" in message.lower()


def test_checkpoint_links_to_a_host_file_are_refused(service: Service, tmp_path: Path) -> None:
    # The workspace is a bind mount of the host's attempt directory: a link the container
    # makes there names a host path, which the agent must never open.
    assert_linked_checkpoints_refused(service, tmp_path)
