"""A job in a container of the worker image, started by the Docker executor on a real engine:
it sees none of its worker's credentials, and records the commit the image was built from.

Runs only where an engine answers and the worker image (REPRO_TEST_WORKER_IMAGE) is built.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.code_wheels import DATA_PY, make_wheel, ring_spec
from tests.integration.jobs import job_request
from tests.integration.test_job_environment import SECRETS
from worker.node.executors.docker import REVISION_LABEL, DockerExecutor
from worker.result import read_result

docker = pytest.importorskip("docker", reason="the docker SDK is not installed (.[docker])")

pytestmark = [pytest.mark.docker, pytest.mark.slow]

IMAGE = os.environ.get("REPRO_TEST_WORKER_IMAGE", "reprotrain-worker-cpu:0.1.0")

# The bundle's architecture writes what the job can see of its environment into its
# workspace (the container's working directory, the only writable place besides /tmp).
_DUMPING_MODEL = b"""\
import json
import os
from typing import Any

import keras


def ring_mlp(params: dict[str, Any], data: Any) -> Any:
    seen = {"environ": dict(os.environ)}
    for pid in ("self", "1"):
        with open(f"/proc/{pid}/environ", "rb") as f:
            seen[pid] = f.read().decode("utf-8", "replace")
    with open("environ.json", "w") as f:
        json.dump(seen, f)
    inputs = keras.Input(shape=data.x_shape)
    return keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(inputs))
"""


@pytest.fixture(scope="module")
def image_labels() -> Iterator[dict[str, str]]:
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine is reachable ({exc})")
    try:
        image = client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"image {IMAGE} is not built (docker/build.sh --base IMAGE cpu)")
    try:
        yield dict(image.attrs["Config"].get("Labels") or {})
    finally:
        client.close()


def test_a_container_job_sees_no_credential_and_records_the_images_commit(
    tmp_path: Path, image_labels: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent's environment, as an operator might start it: its token and more.
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a numerics variable: it must reach the job
    wheel = make_wheel(
        {
            "ring_bundle/__init__.py": b"",
            "ring_bundle/data.py": DATA_PY.encode(),
            "ring_bundle/model.py": _DUMPING_MODEL,
        }
    )
    digest = "sha256:" + hashlib.sha256(wheel).hexdigest()
    attempt = tmp_path / "attempt"
    spec = yaml.safe_load(ring_spec(digest))
    spec["training"]["epochs"] = 1
    code_file = attempt / "code" / "ring_bundle-1.0-py3-none-any.whl"
    request = job_request(
        attempt,
        spec,
        f"env-{tmp_path.name}",
        None,
        environment={"REPRO_PROVENANCE_KEY": "the-claims-provenance-key"},
        code_file=code_file,
    )
    code_file.parent.mkdir()
    code_file.write_bytes(wheel)

    executor = DockerExecutor(images=[IMAGE], memory="1g")
    job = executor.start(request)
    try:
        stderr = "\n".join(job.stderr_lines())
        code = job.wait()
    finally:
        job.close()

    assert code == 0, stderr
    result = read_result(request.result_path)
    assert result.error is None, result.error
    seen = json.loads((attempt / "environ.json").read_text())
    everything = json.dumps(seen)
    for name, value in SECRETS.items():
        assert value not in everything, f"the job saw {name}"
    assert "REPRO_TOKEN" not in seen["environ"]
    assert seen["environ"]["REPRO_PROVENANCE_KEY"] == "the-claims-provenance-key"
    assert seen["environ"]["OMP_NUM_THREADS"] == "1"

    # The image's build names its commit; the job records it as the package's.
    revision = image_labels.get(REVISION_LABEL)
    if revision in (None, "unknown"):
        pytest.skip(f"image {IMAGE} was built outside a git checkout: no revision to record")
    package = result.provenance["package"]
    assert package["git_commit"] == revision
