"""Derived worker images, through a real engine and PyPI: `docker/build.sh user --requirements
FILE` installs a hashed lock on top of the pinned worker image, labelled with both; a lock
whose hash is wrong builds nothing; a code bundle importing a package the worker image lacks
fails there naming the command, and trains in the derived image a spec pins by ID.

Runs only where an engine answers, the worker image (REPRO_TEST_WORKER_IMAGE) is built and
PyPI is reachable; skips saying why otherwise.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.code_wheels import DATA_PY, MODEL_PY, make_wheel, ring_spec
from tests.integration.service_procs import service_with_worker
from tests.integration.test_code_bundles import pushed_digest

docker = pytest.importorskip("docker", reason="the docker SDK is not installed (.[docker])")

pytestmark = [pytest.mark.docker]

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("REPRO_TEST_WORKER_IMAGE", "reprotrain-worker-cpu:0.1.0")
# A tiny pure-Python wheel the worker image does not hold, pinned by its PyPI hash.
LOCK = """\
inflection==0.5.1 \\
    --hash=sha256:f38b2b640938a4f35ade69ac3d053042959b62a0f1076a5bbaa1b9526605a8a2
"""


def _build(lock: Path, tag: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "docker" / "build.sh"), "user", "--requirements", str(lock),
         "--from", IMAGE, "--tag", tag],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine is reachable ({exc})")
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        client.close()
        pytest.skip(f"image {IMAGE} is not built (docker/build.sh --base IMAGE cpu)")
    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
    except OSError as exc:
        client.close()
        pytest.skip(f"PyPI is not reachable to install the lock from ({exc})")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def derived(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The derived image's ID, built once for the module and removed after it."""
    lock = tmp_path_factory.mktemp("derived-lock") / "requirements.txt"
    lock.write_text(LOCK)
    tag = f"reprotrain-test-derived:{uuid.uuid4().hex[:12]}"
    built = _build(lock, tag)
    assert built.returncode == 0, built.stderr
    name, version, image_id = built.stdout.split()
    assert (name, version) == tuple(tag.split(":"))
    try:
        yield image_id
    finally:
        engine.images.remove(tag, force=True)


def test_derived_image_holds_the_locked_package_on_the_pinned_worker_image(
    engine: Any, derived: str
) -> None:
    base = engine.images.get(IMAGE)
    image = engine.images.get(derived)
    labels = image.labels
    assert labels["org.opencontainers.image.base.digest"] == base.id
    assert labels["org.opencontainers.image.base.name"] == IMAGE
    assert labels["io.reprotrain.requirements.digest"] == (
        "sha256:" + hashlib.sha256(LOCK.encode()).hexdigest()
    )
    # Every layer of the worker image, in order, then the package's.
    base_layers = base.attrs["RootFS"]["Layers"]
    assert image.attrs["RootFS"]["Layers"][: len(base_layers)] == base_layers
    assert image.attrs["Config"]["User"] == base.attrs["Config"]["User"] != ""
    probe = "import inflection, os; print(inflection.__version__, os.getuid())"
    out = engine.containers.run(derived, entrypoint=["python3", "-c", probe], remove=True)
    assert out.decode().split() == ["0.5.1", "10001"]
    with pytest.raises(docker.errors.ContainerError):
        engine.containers.run(
            base.id, entrypoint=["python3", "-c", "import inflection"], remove=True
        )


def test_a_lock_whose_hash_is_wrong_builds_nothing(engine: Any, tmp_path: Path) -> None:
    lock = tmp_path / "requirements.txt"
    lock.write_text(LOCK.replace("f38b2b64", "00000000"))
    tag = f"reprotrain-test-derived:{uuid.uuid4().hex[:12]}"
    built = _build(lock, tag)
    assert built.returncode != 0
    assert "HASHES" in built.stderr.upper() and "FAILED to build user" in built.stderr
    with pytest.raises(docker.errors.ImageNotFound):
        engine.images.get(tag)


@pytest.mark.slow  # trains a tiny model in a container
def test_a_bundle_needing_the_package_fails_on_the_worker_image_and_trains_on_the_derived(
    engine: Any, derived: str, tmp_path: Path
) -> None:
    base = engine.images.get(IMAGE)
    try:
        engine.containers.run(
            base.id, entrypoint=["python3", "-c", "import worker.models.code_bundles"], remove=True
        )
    except docker.errors.ContainerError:
        pytest.skip(f"image {IMAGE} predates code bundles: rebuild it (docker/build.sh cpu)")
    model = b"import inflection  # the package only the derived image holds\n"
    body = make_wheel(
        {
            "ring_bundle/__init__.py": b"",
            "ring_bundle/data.py": DATA_PY.encode(),
            "ring_bundle/model.py": model + MODEL_PY.encode(),
        }
    )
    with service_with_worker(
        tmp_path,
        "--executor", "docker", "--image", base.id, "--image", derived, "--memory", "1g",
        name=f"derived-{uuid.uuid4().hex[:8]}",
    ) as svc:  # fmt: skip
        digest = pushed_digest(svc.client, body)

        def run(spec: str) -> dict[str, Any]:
            created = svc.submit(spec)
            assert created.status_code == 201, created.text
            return svc.wait_run(int(created.json()["run"]["id"]), timeout=300)

        lacking = run(ring_spec(digest, f'environment: {{image: "{base.id}"}}\n'))
        trained = run(ring_spec(digest, f'environment: {{image: "{derived}"}}\n'))
    assert lacking["status"] == "failed"
    message = lacking["error"]["message"]
    assert "'inflection'" in message and "docker/build.sh user --requirements" in message
    assert trained["status"] == "succeeded", trained["error"]
    assert trained["provenance"]["image"]["id"] == derived
    assert trained["provenance"]["code"]["digest"] == digest
