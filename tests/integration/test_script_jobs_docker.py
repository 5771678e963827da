"""A script experiment under the Docker executor, through a real API, agent and engine: the
script's directory runs in the locked-down container of the pinned image, `reprotrain.init()`
there takes the run's seed, the server verifies the uploaded checkpoint, and a rerun in a
fresh container is `identical`; the provenance names the image and the script's files. A
script importing a package the image lacks fails saying which, and how to add it.

Runs only where an engine answers and the worker image (REPRO_TEST_WORKER_IMAGE) carries the
in-script runtime; skips saying why otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.integration.service_procs import Service, service_with_worker
from tests.integration.test_code_bundles_docker import IMAGE, worker_image_with
from tests.integration.test_script_jobs import SCRIPTS, cli

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def image_id() -> Iterator[str]:
    yield from worker_image_with("worker.script.job", "script runs")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, image_id: str) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("script-docker")
    with service_with_worker(
        root,
        "--executor", "docker", "--image", IMAGE, "--memory", "1g",
        name=f"docker-{root.name}",
        env={"REPRO_LEASE_SECONDS": "20"},
    ) as svc:  # fmt: skip
        yield svc


def test_a_script_trains_in_a_container_and_reruns_identical(
    service: Service, image_id: str
) -> None:
    out = cli(
        service, "run", str(SCRIPTS / "gradient_tape.py"), "--seed", "5", "--wait",
        "--", "--epochs", "2",
    )  # fmt: skip
    run_id = int(re.search(r"\brun (\d+)\b", out).group(1))  # type: ignore[union-attr]
    first = service.client.get(f"/api/v1/runs/{run_id}").json()
    assert first["status"] == "succeeded", first.get("error")
    assert first["spec"]["kind"] == "script"
    assert first["provenance"]["seed"] == [5, 0]
    assert "gradient_tape.py" in first["provenance"]["code"]["files"]
    assert first["provenance"]["image"]["id"] == image_id  # what the engine ran
    # The server recomputed the final fingerprint from the checkpoint the container wrote.
    assert first["final_fingerprint"] == first["trace"][-1]["fingerprint"]
    assert [d["epoch"] for d in first["data_fingerprints"]] == [1, 2]

    out = cli(service, "rerun", str(run_id), "--wait")
    rerun_id = int(re.search(r"\brun (\d+)\b", out).group(1))  # type: ignore[union-attr]
    rerun = service.client.get(f"/api/v1/runs/{rerun_id}").json()
    assert rerun["verdict"] == "identical", out
    assert rerun["final_fingerprint"] == first["final_fingerprint"]
    assert rerun["required_image"] == image_id  # the rerun was pinned to the same image


def test_a_script_importing_what_the_image_lacks_fails_naming_it(service: Service) -> None:
    # The worker image holds TensorFlow and Reprotrain, not scikit-learn (fit_digits's data).
    out = cli(
        service, "run", str(SCRIPTS / "fit_digits.py"), "--wait", "--", "--epochs", "1",
        expect=1,
    )  # fmt: skip
    run_id = int(re.search(r"\brun (\d+)\b", out).group(1))  # type: ignore[union-attr]
    run = service.client.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "failed"
    message = run["error"]["message"]
    assert "ModuleNotFoundError: No module named 'sklearn'" in message, message
    assert "derived worker image" in message
