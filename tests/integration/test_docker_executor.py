"""The docker executor through a real API and real agents: each job in a fresh container of
the CPU worker image built from docker/ (docker/build.sh), on a real Docker engine.

Runs only where an engine answers and the image is built; REPRO_TEST_WORKER_IMAGE names
another image.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.jobs import job_env, job_request
from tests.integration.service_procs import Service, WorkerProc

docker = pytest.importorskip("docker", reason="the docker SDK is not installed (.[docker])")

pytestmark = [pytest.mark.docker, pytest.mark.slow]

IMAGE = os.environ.get("REPRO_TEST_WORKER_IMAGE", "reprotrain-worker-cpu:0.1.0")
RUN_LABEL = "org.reprotrain.run"
MEMORY = "800m"

SMALL = """
name: docker-small
seed: 42
dataset:
  generator: gaussian_blobs
  params: {num_features: 4, num_classes: 2, center_scale: 0, spread: 1.0}
  batch_size: 16
  train_batches: 7
model: {architecture: mlp, params: {hidden: [8], activation: relu}}
training:
  epochs: 3
  optimizer: {name: adam, params: {learning_rate: 0.001}}
  loss: {name: sparse_categorical_crossentropy, params: {from_logits: true}}
"""
# Epochs of a second or more, so that a stop sent after the first lands well before the last.
LONGER = """
name: docker-longer
seed: 7
dataset:
  generator: gaussian_blobs
  params: {num_features: 64, num_classes: 2}
  batch_size: 256
  train_batches: 100
model: {architecture: mlp, params: {hidden: [512, 512], activation: relu}}
training:
  epochs: 5
  optimizer: {name: adam, params: {learning_rate: 0.001}}
  loss: {name: sparse_categorical_crossentropy, params: {from_logits: true}}
"""
# About 85 million parameters: over a GB with the optimizer's slots, beyond MEMORY.
TOO_BIG = """
name: docker-too-big
seed: 1
dataset:
  generator: gaussian_blobs
  params: {num_features: 2048, num_classes: 2}
  batch_size: 8
  train_batches: 1
model: {architecture: mlp, params: {hidden: [8192, 8192]}}
training:
  epochs: 1
  optimizer: {name: adam}
  loss: {name: sparse_categorical_crossentropy, params: {from_logits: true}}
"""


def _engine() -> Any:
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine is reachable ({exc})")
    return client


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    client = _engine()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def image_id(engine: Any) -> str:
    try:
        return str(engine.images.get(IMAGE).id)
    except docker.errors.ImageNotFound:
        pytest.skip(f"image {IMAGE} is not built (docker/build.sh --base IMAGE cpu)")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, image_id: str) -> Iterator[Service]:
    data = tmp_path_factory.mktemp("docker-api") / "data"
    env = {"REPRO_LEASE_SECONDS": "8", "REPRO_HEARTBEAT_SECONDS": "2"}
    svc = Service(data, env=env, extra=("--no-demo",)).wait_ready()
    try:
        yield svc
    finally:
        svc.stop()


def docker_agent(service: Service, work_dir: Path, token: str | None = None) -> WorkerProc:
    """An agent running each job in a container of IMAGE; a new worker unless `token` is given."""
    name = f"{work_dir.parent.name}-{work_dir.name}"  # unique across this module's tests
    return WorkerProc(
        service.url,
        work_dir,
        token=token or service.token("worker", name),
        name=name,
        extra=("--executor", "docker", "--image", IMAGE, "--memory", MEMORY),
    )


def pinned(spec: str, image: str) -> str:
    return spec + f"environment: {{image: '{image}'}}\n"


def submit(service: Service, spec: str) -> int:
    created = service.submit(spec)
    assert created.status_code == 201, created.text
    return int(created.json()["run"]["id"])


def wait_for(service: Service, run_id: int, check: Any, timeout: float = 180) -> dict[str, Any]:
    """The run once `check(run)` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run: dict[str, Any] = service.client.get(f"/api/v1/runs/{run_id}").json()
        if check(run):
            return run
        time.sleep(0.2)
    raise TimeoutError(f"run {run_id}: {run['status']} {run.get('progress')}")


def run_containers(engine: Any, run_id: int, work_dir: Path) -> list[Any]:
    """The containers of run `run_id` whose workspace is under `work_dir`: other modules'
    services number their runs too, on the same engine, at the same time."""
    found = engine.containers.list(
        all=True,
        filters={"label": f"{RUN_LABEL}={run_id}"},
        ignore_removed=True,  # one removed between the listing and its inspection
    )
    return [
        c
        for c in found
        if any(Path(m["Source"]).is_relative_to(work_dir) for m in c.attrs.get("Mounts", []))
    ]


def test_container_job_equals_process_job_and_its_image_is_provenance(
    service: Service, image_id: str, tmp_path: Path
) -> None:
    # Cross-executor reproducibility: the same spec in a fresh process and in a container.
    process_agent = service.worker(tmp_path / "process")
    container_agent: WorkerProc | None = None
    try:
        by_process = service.wait_run(submit(service, SMALL))
        assert by_process["status"] == "succeeded", by_process["error"]
        container_agent = docker_agent(service, tmp_path / "docker")
        docker_wid = container_agent.worker_id()
        by_container = service.wait_run(submit(service, pinned(SMALL, image_id)))
        assert by_container["status"] == "succeeded", by_container["error"]
        assert by_container["worker_id"] == docker_wid
        assert by_container["final_fingerprint"] == by_process["final_fingerprint"]
        image = by_container["provenance"]["image"]
        assert image["id"] == image_id  # what the engine ran, as it names it
        assert image["reference"] == IMAGE and image["in_container"] is True
        assert by_process["provenance"]["image"]["id"] is None

        # A rerun pins the image its original ran: no other worker may take it.
        container_agent.stop()
        rerun = service.client.post(f"/api/v1/runs/{by_container['id']}/rerun")
        assert rerun.status_code == 202, rerun.text
        rerun_id = int(rerun.json()["id"])
        assert rerun.json()["required_image"] == image_id
        waiting = wait_for(service, rerun_id, lambda r: r["waiting_reason"] is not None, 60)
        assert waiting["status"] == "queued" and image_id in waiting["waiting_reason"]
        # The process worker is live and idle all along, and has not taken it.
        assert process_agent.proc.poll() is None
        container_agent = docker_agent(service, tmp_path / "docker-again")
        again_wid = container_agent.worker_id()
        done = service.wait_run(rerun_id)
        assert done["status"] == "succeeded" and done["worker_id"] == again_wid
        assert done["verdict"] == "identical"
        assert done["final_fingerprint"] == by_process["final_fingerprint"]
    finally:
        if container_agent is not None:
            container_agent.stop()
        process_agent.stop()


def test_job_over_its_memory_limit_fails_saying_so(
    service: Service, image_id: str, tmp_path: Path
) -> None:
    agent = docker_agent(service, tmp_path / "docker")
    try:
        agent.worker_id()
        run = service.wait_run(submit(service, pinned(TOO_BIG, image_id)))
        assert run["status"] == "failed"
        assert f"out of memory (limit {MEMORY})" in run["error"]["message"], run["error"]
        assert agent.proc.poll() is None  # the worker goes on
    finally:
        agent.stop()


def test_sigterm_checkpoints_releases_and_another_worker_resumes_identically(
    service: Service, engine: Any, image_id: str, tmp_path: Path
) -> None:
    first = docker_agent(service, tmp_path / "first")
    later: WorkerProc | None = None
    try:
        run_id = submit(service, pinned(LONGER, image_id))
        wait_for(service, run_id, lambda r: (r["checkpoint_epoch"] or 0) >= 1)
        first.signal(signal.SIGTERM)  # mid-job: it checkpoints the step it is at, releases
        assert first.proc.returncode == 0
        released = service.client.get(f"/api/v1/runs/{run_id}").json()
        assert released["status"] == "queued" and released["checkpoint_epoch"] >= 1
        step = released["checkpoint_step"]  # the signal's, or an epoch end's if it landed there
        assert run_containers(engine, run_id, tmp_path) == []  # removed, not left behind
        later = docker_agent(service, tmp_path / "later")
        resumed = service.wait_run(run_id)
        assert resumed["status"] == "succeeded", resumed["error"]
        assert resumed["result_summary"]["resumed_from_step"] == step
        # An uninterrupted run of the same spec and seed ends with the same bits.
        rerun = service.client.post(f"/api/v1/runs/{run_id}/rerun").json()
        straight = service.wait_run(int(rerun["id"]))
        assert straight["verdict"] == "identical"
        assert straight["final_fingerprint"] == resumed["final_fingerprint"]
    finally:
        first.stop()
        if later is not None:
            later.stop()


def killed_mid_job(
    service: Service, engine: Any, work_dir: Path, spec: str
) -> tuple[WorkerProc, int, int, Any]:
    """(the agent, its worker id, the run, its container): the agent SIGKILLed while the
    run's job trains in a container that outlives it."""
    agent = docker_agent(service, work_dir)
    try:
        wid = agent.worker_id()
        run_id = submit(service, spec)
        deadline = time.monotonic() + 120
        # Killed while the job starts (its interpreter takes seconds), well before it can end.
        while not [c for c in run_containers(engine, run_id, work_dir) if c.status == "running"]:
            assert time.monotonic() < deadline, agent.log.read_text()
            time.sleep(0.2)
    except BaseException:
        agent.stop()
        raise
    agent.kill()
    [container] = run_containers(engine, run_id, work_dir)
    return agent, wid, run_id, container


def produced(work_dir: Path, run_id: int) -> dict[str, Any]:
    """The result document the run's first attempt wrote in its workspace."""
    path = work_dir / "runs" / str(run_id) / "attempt-1" / "result.json"
    return dict(json.loads(path.read_text()))


def test_a_restarted_agent_adopts_the_job_its_killed_predecessor_left_running(
    service: Service, engine: Any, image_id: str, tmp_path: Path
) -> None:
    work_dir = tmp_path / "docker"
    agent, wid, run_id, container = killed_mid_job(
        service, engine, work_dir, pinned(LONGER, image_id)
    )
    container.reload()
    assert container.status == "running"  # the job outlived its agent
    again = docker_agent(service, work_dir, token=agent.token)  # the same worker, restarted
    try:
        done = service.wait_run(run_id)
        assert done["status"] == "succeeded", done["error"]
        # Not trained again: the first attempt's job, followed to its end by the new agent.
        assert (done["attempt"], done["worker_id"]) == (1, wid)
        assert done["result_summary"]["resumed_from_epoch"] is None
        assert done["final_fingerprint"] == produced(work_dir, run_id)["final_fingerprint"]
        assert done["checkpoint_epoch"] == 5  # the epochs it checkpointed unwatched are in
        assert run_containers(engine, run_id, work_dir) == []
        assert f"adopting container {container.short_id} (running)" in again.log.read_text()
    finally:
        again.stop()


def test_a_job_that_ended_while_no_agent_ran_is_reported_by_the_next_one(
    service: Service, engine: Any, image_id: str, tmp_path: Path
) -> None:
    work_dir = tmp_path / "docker"
    agent, wid, run_id, container = killed_mid_job(
        service, engine, work_dir, pinned(SMALL, image_id)
    )
    assert container.wait(timeout=120)["StatusCode"] == 0
    again = docker_agent(service, work_dir, token=agent.token)
    try:
        done = service.wait_run(run_id)
        assert done["status"] == "succeeded", done["error"]
        assert (done["attempt"], done["worker_id"]) == (1, wid)
        assert done["final_fingerprint"] == produced(work_dir, run_id)["final_fingerprint"]
        assert run_containers(engine, run_id, work_dir) == []
        # The same bits as a run no agent left: an uninterrupted rerun of the same spec.
        rerun = service.client.post(f"/api/v1/runs/{run_id}/rerun")
        assert rerun.status_code == 202, rerun.text
        straight = service.wait_run(int(rerun.json()["id"]))
        assert straight["verdict"] == "identical", straight["error"]
    finally:
        again.stop()


def test_a_job_whose_run_another_worker_claimed_since_is_removed_not_adopted(
    service: Service, engine: Any, image_id: str, tmp_path: Path
) -> None:
    work_dir = tmp_path / "docker"
    agent, _, run_id, container = killed_mid_job(
        service, engine, work_dir, pinned(LONGER, image_id)
    )
    rival = service.client_for("worker", f"rival-{tmp_path.name}")
    registered = rival.post(
        "/api/v1/workers/register",
        json={"name": f"rival-{tmp_path.name}", "executors": ["docker"], "images": [image_id]},
    )
    assert registered.status_code == 201, registered.text
    rival_id = registered.json()["id"]
    deadline = time.monotonic() + 60
    while (claim := rival.post(f"/api/v1/workers/{rival_id}/claim")).status_code == 204:
        assert time.monotonic() < deadline, "the lapsed run was not requeued"
        time.sleep(0.5)  # until the killed agent's lease lapses and the run is requeued
    assert claim.json()["run"]["id"] == run_id and claim.json()["run"]["attempt"] == 2
    again: WorkerProc | None = None
    with holding(rival, run_id, rival_id, attempt=2):
        try:
            again = docker_agent(service, work_dir, token=agent.token)
            again.worker_id()
            deadline = time.monotonic() + 60
            while run_containers(engine, run_id, work_dir):
                assert time.monotonic() < deadline, again.log.read_text()
                time.sleep(0.2)
            said = again.log.read_text()
            assert f"removing container {container.short_id} of run {run_id}" in said
            assert "no longer this worker's" in said and "adopting" not in said
            run = service.client.get(f"/api/v1/runs/{run_id}").json()
            assert (run["status"], run["worker_id"], run["attempt"]) == ("running", rival_id, 2)
        finally:
            service.client.post(f"/api/v1/runs/{run_id}/cancel")
            if again is not None:
                again.stop()


@contextmanager
def holding(worker: httpx.Client, run_id: int, worker_id: int, *, attempt: int) -> Iterator[None]:
    """Keep the run's lease for `worker_id` with a heartbeat a second."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(1.0):
            body = {"worker_id": worker_id, "attempt": attempt, "progress": None}
            worker.post(f"/api/v1/runs/{run_id}/heartbeat", json=body)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        yield
    finally:
        done.set()
        beater.join()


def test_a_run_pinned_by_tag_alone_is_refused_unless_the_operator_allows_tags(
    image_id: str,
) -> None:
    from worker.node.executors.docker import DockerExecutor, ImageRefused

    strict = DockerExecutor(images=[IMAGE])
    assert strict.image_for(image_id).id == image_id
    assert strict.image_for(None).id == image_id  # a run that pins nothing: the first image
    with pytest.raises(ImageRefused, match="tag without a digest"):
        strict.image_for(IMAGE)
    assert IMAGE not in strict.advertised_images()
    with pytest.raises(ImageRefused, match="not one of this worker's images"):
        strict.image_for("sha256:" + "0" * 64)
    lenient = DockerExecutor(images=[IMAGE], allow_tag=True)
    assert lenient.image_for(IMAGE).id == image_id
    assert {image_id, IMAGE} <= set(lenient.advertised_images())


def test_the_checks_container_a_killed_agent_left_is_removed_by_the_next(
    engine: Any, image_id: str
) -> None:
    from worker.node.executors.docker import LABEL_AGENT, DockerExecutor
    from worker.node.readiness_probe import container_options, job_user

    executor = DockerExecutor(images=[image_id])
    image = executor.image_for(None)
    # As the checks' container of an agent killed mid-check: its labels, never started.
    labels = {**executor.agent_labels(), LABEL_AGENT: "gone/1/1"}
    left = engine.containers.create(
        **container_options(image.id, gpus=False, user=job_user(image.user)), labels=labels
    )
    mine = engine.containers.create(
        **container_options(image.id, gpus=False, user=job_user(image.user)),
        labels=executor.agent_labels(),  # a live agent's (this one's): kept
    )
    try:
        assert executor.orphaned_jobs() == []  # not a job: nothing to adopt
        ids = {c.id for c in engine.containers.list(all=True)}
        assert left.id not in ids and mine.id in ids
    finally:
        mine.remove(force=True)


def test_a_job_past_its_deadline_is_stopped_in_its_locked_down_container(
    engine: Any, image_id: str, tmp_path: Path
) -> None:
    from worker.node.executors.docker import DockerExecutor

    executor = DockerExecutor(images=[image_id], memory=MEMORY, cpus=1.5, pids=256, deadline=2)
    request = job_request(tmp_path, yaml.safe_load(LONGER), "deadline", image_id)
    job = executor.start(request)
    try:
        host = job.container.attrs["HostConfig"]
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"]
        assert (host["Memory"], host["NanoCpus"], host["PidsLimit"]) == (800 << 20, 15 * 10**8, 256)
        assert job.container.attrs["Config"]["User"] not in ("", "0", "root")
        assert job.container.attrs["Image"] == image_id
        list(job.stderr_lines())
        assert job.wait() != 0
        assert job.failure_reason is not None and "deadline exceeded" in job.failure_reason
        assert not request.result_path.exists()  # so the run fails instead of being requeued
    finally:
        job.close()
    with pytest.raises(docker.errors.NotFound):
        engine.containers.get(job.container.id)


def test_a_stored_dataset_is_mounted_read_only_and_trains_as_in_a_process(
    image_id: str, tmp_path: Path
) -> None:
    from tests.integration.test_datasets_api import digits_like, sha256, spec_using
    from worker.node.executors.docker import DockerExecutor

    body = digits_like(n=48, seed=3)
    digest = sha256(body)
    cached = tmp_path / "datasets" / digest.removeprefix("sha256:")  # as the node caches it
    cached.parent.mkdir()
    cached.write_bytes(body)
    spec = json.loads(spec_using(digest))

    request = job_request(
        tmp_path / "container", spec, "stored-dataset", image_id, dataset_file=cached
    )
    job = DockerExecutor(images=[image_id], memory=MEMORY).start(request)
    try:
        [mount] = [m for m in job.container.attrs["Mounts"] if m["Source"] == str(cached)]
        assert mount["Destination"] == f"/datasets/{cached.name}" and mount["RW"] is False
        stderr = "".join(job.stderr_lines())
        assert job.wait() == 0, stderr[-3000:]
    finally:
        job.close()
    by_container = json.loads(request.result_path.read_text())
    assert by_container["status"] == "succeeded", by_container.get("error")
    assert by_container["provenance"]["dataset"]["digest"] == digest
    assert cached.read_bytes() == body

    # The same job in a plain process, on the same file: the same data, the same weights.
    in_process = job_request(tmp_path / "process", spec, "stored-dataset", None)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "worker.run", "--spec", str(in_process.spec_path)),
            *("--out", str(in_process.result_path), "--dataset-file", str(cached)),
        ],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    by_process = json.loads(in_process.result_path.read_text())
    assert by_process["status"] == "succeeded", done.stderr[-3000:]
    assert by_container["data_fingerprints"] == by_process["data_fingerprints"]
    assert by_container["final_fingerprint"] == by_process["final_fingerprint"]
