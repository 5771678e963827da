"""End to end through HTTP: real API server, real worker processes, real TensorFlow jobs."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import REPO, blobs_spec, job_env, run_job
from tests.integration.service_procs import Service, running

pytestmark = pytest.mark.slow

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    if request.param == "sqlite":
        return None  # the embedded default: a SQLite file in the data directory
    url: str = request.getfixturevalue("postgres_url")
    return url


def test_submit_train_rerun_identical(tmp_path: Path, database_url: str | None) -> None:
    service = Service(tmp_path / "data", database_url=database_url, extra=("--no-demo",))
    with running(service, tmp_path / "worker") as (svc, _):
        created = svc.submit(SEED001)
        assert created.status_code == 201, created.text
        run_id = created.json()["run"]["id"]
        seed = created.json()["experiment"]["seed"]
        run = svc.wait_run(run_id)
        assert run["status"] == "succeeded", run["error"]
        assert run["final_fingerprint"].startswith("blake3:")
        assert run["seed"] == seed == [42, 0]
        assert run["provenance"]["libraries"]["tensorflow"] == "2.21.0"
        assert run["provenance"]["spec_hash"] == run["spec_hash"]
        assert [p["kind"] for p in run["trace"]] == ["init", "epoch", "epoch", "epoch"]
        assert run["is_reference"] and run["checkpoint_epoch"] == 3

        rerun = svc.client.post(f"/api/v1/runs/{run_id}/rerun")
        assert rerun.status_code == 202
        second = svc.wait_run(rerun.json()["id"])
        assert second["status"] == "succeeded"
        assert second["verdict"] == "identical", second["verdict_report"]
        assert second["final_fingerprint"] == run["final_fingerprint"]
        assert second["rerun_of_id"] == run_id and second["family_id"] == run_id

        # A rerun of the rerun belongs to the same family and is compared with the reference.
        third = svc.wait_run(svc.client.post(f"/api/v1/runs/{second['id']}/rerun").json()["id"])
        assert third["family_id"] == run_id and third["reference_run_id"] == run_id
        assert third["verdict"] == "identical"
        listed = svc.client.get("/api/v1/runs", params={"verdict": "identical"}).json()
        assert {r["id"] for r in listed["items"]} == {second["id"], third["id"]}

        events = svc.client.get(f"/api/v1/runs/{run_id}/events").text
        assert "event: run" in events and '"status": "succeeded"' in events


def _blobs(**training: Any) -> str:
    spec = blobs_spec()
    spec["training"].update(training)
    return json.dumps(spec)


def test_killed_worker_run_resumes_elsewhere_with_same_fingerprint(tmp_path: Path) -> None:
    spec = blobs_spec(dataset={**blobs_spec()["dataset"], "batch_size": 512, "train_batches": 40})
    spec["training"]["epochs"] = 6
    reference = run_job(spec, tmp_path / "reference")
    assert reference.result.status == "succeeded"

    env = {"REPRO_LEASE_SECONDS": "4", "REPRO_HEARTBEAT_SECONDS": "1"}
    service = Service(tmp_path / "data", env=env, extra=("--no-demo",))
    with running(service, tmp_path / "first") as (svc, (first,)):
        run_id = svc.submit(json.dumps(spec), "application/json").json()["run"]["id"]
        deadline = time.monotonic() + 240
        while svc.client.get(f"/api/v1/runs/{run_id}").json()["checkpoint_epoch"] is None:
            assert time.monotonic() < deadline, "no checkpoint uploaded"
            time.sleep(0.2)
        first.kill()  # SIGKILL: no goodbye, the job process dies with it
        killed_at = svc.client.get(f"/api/v1/runs/{run_id}").json()
        assert killed_at["status"] == "running" and killed_at["attempt"] == 1
        second = svc.worker(tmp_path / "second")
        try:
            done = svc.wait_run(run_id)
        finally:
            second.stop()
    assert done["status"] == "succeeded", done["error"]
    assert done["attempt"] == 2
    assert done["result_summary"]["resumed_from_epoch"] >= 1
    assert done["final_fingerprint"] == reference.result.final_fingerprint


# --- bad input: clear errors, nothing stored, never a 500 -----------------------------------


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Any:
    service = Service(tmp_path_factory.mktemp("api") / "data", extra=("--no-demo",))
    service.wait_ready()
    yield service
    service.stop()


def _count(api: Service) -> int:
    return int(api.client.get("/api/v1/experiments").json()["total"])


@pytest.mark.parametrize(
    ("body", "content_type", "status", "needle"),
    [
        ("name: [", "application/yaml", 400, "malformed YAML"),
        ('{"name": ', "application/json", 400, "malformed JSON"),
        (
            SEED001.replace("batch_size: 16", "batch_size: -3"),
            "application/yaml",
            422,
            "dataset.batch_size",
        ),
        (
            SEED001.replace("generator: gaussian_blobs", "generator: imagenet"),
            "application/yaml",
            422,
            "known: arrays, gaussian_blobs, pattern_images, regression",
        ),
        (SEED001 + "\nsurprise: 1\n", "application/yaml", 422, "surprise"),
        (SEED001, "text/csv", 415, "JSON or YAML"),
        ("x" * 2_000_000, "application/yaml", 413, "larger than"),
    ],
)
def test_bad_submissions_are_rejected_and_store_nothing(
    api: Service, body: str, content_type: str, status: int, needle: str
) -> None:
    before = _count(api)
    response = api.submit(body, content_type)
    assert response.status_code == status, response.text
    assert needle in response.text
    assert _count(api) == before


def test_idempotency_key_returns_the_original(api: Service) -> None:
    first = api.submit(SEED001, **{"Idempotency-Key": "abc-1"})
    again = api.submit(SEED001, **{"Idempotency-Key": "abc-1"})
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["run"]["id"] == first.json()["run"]["id"]
    other = api.submit(SEED001.replace("seed: 42", "seed: 43"), **{"Idempotency-Key": "abc-1"})
    assert other.status_code == 409
    # Keys belong to the token that sent them: another submitter's "abc-1" is its own.
    with api.client_for("submitter", "someone else") as theirs:
        headers = {"content-type": "application/yaml", "Idempotency-Key": "abc-1"}
        body = SEED001.replace("seed: 42", "seed: 44")
        mine = theirs.post("/api/v1/experiments", content=body, headers=headers)
        assert mine.status_code == 201, mine.text
        assert mine.json()["run"]["id"] != first.json()["run"]["id"]
        replay = theirs.post("/api/v1/experiments", content=body, headers=headers)
        assert replay.status_code == 200 and replay.json()["run"]["id"] == mine.json()["run"]["id"]


def test_unknown_ids_are_404_and_foreign_reports_403(api: Service) -> None:
    assert api.client.get("/api/v1/runs/999999").status_code == 404
    assert api.client.post("/api/v1/runs/999999/rerun").status_code == 404
    assert api.client.get("/api/v1/experiments/999999").status_code == 404
    api.submit(SEED001)  # a queued run for the probe worker to claim
    probe = api.client_for("worker", "probe")
    worker = probe.post("/api/v1/workers/register", json={"name": "probe"}).json()
    claimed = probe.post(f"/api/v1/workers/{worker['id']}/claim")
    assert claimed.status_code == 200
    held = claimed.json()["run"]["id"]
    other = api.client_for("worker", "stranger")
    stranger = other.post("/api/v1/workers/register", json={"name": "stranger"}).json()
    for path, body in [
        ("heartbeat", {"worker_id": stranger["id"]}),
        ("fail", {"worker_id": stranger["id"], "error": {"type": "X", "message": "no"}}),
        ("release", {"worker_id": stranger["id"]}),
    ]:
        response = other.post(f"/api/v1/runs/{held}/{path}", json=body)
        assert response.status_code == 403, (path, response.text)
        # ...and the stranger cannot pretend to be the holder either.
        impostor = other.post(
            f"/api/v1/runs/{held}/{path}", json={**body, "worker_id": worker["id"]}
        )
        assert impostor.status_code == 403, (path, impostor.text)
    still = api.client.get(f"/api/v1/runs/{held}").json()
    assert still["status"] == "running" and still["worker_id"] == worker["id"]


def test_tampered_artifact_upload_is_rejected_and_leaves_no_file(
    api: Service, tmp_path: Path
) -> None:
    api.submit(SEED001)
    up = api.client_for("worker", "up")
    worker = up.post("/api/v1/workers/register", json={"name": "up"}).json()
    run_id = up.post(f"/api/v1/workers/{worker['id']}/claim").json()["run"]["id"]
    data = b"weights" * 1000
    good = hashlib.sha256(data).hexdigest()
    params = {
        "worker_id": worker["id"],
        "kind": "checkpoint",
        "name": "epoch-000001.npz",
        "epoch": 1,
    }
    bad = up.post(
        f"/api/v1/runs/{run_id}/artifacts",
        params=params,
        content=data[:-1],
        headers={"X-Content-SHA256": good},
    )
    assert bad.status_code == 400 and "SHA-256" in bad.text
    stored = api.data_dir / "artifacts"
    assert not stored.exists() or not [p for p in stored.rglob("*") if p.is_file()]
    ok = up.post(
        f"/api/v1/runs/{run_id}/artifacts",
        params=params,
        content=data,
        headers={"X-Content-SHA256": good},
    )
    assert ok.status_code == 201 and ok.json()["size"] == len(data)
    download = api.client.get(f"/api/v1/artifacts/{ok.json()['id']}")
    assert download.content == data
    assert [p.name for p in stored.rglob("*") if p.is_file()] == [good]


def test_cancelled_run_cannot_be_rerun(api: Service) -> None:
    run_id = api.submit(SEED001).json()["run"]["id"]
    assert api.client.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
    again = api.client.post(f"/api/v1/runs/{run_id}/rerun")
    assert again.status_code == 409 and "cancelled" in again.text


def test_no_5xx_for_odd_requests(api: Service) -> None:
    odd = [
        ("GET", "/api/v1/runs?limit=0", None),
        ("GET", "/api/v1/runs?status=exploded", None),
        ("GET", "/api/v1/runs/abc", None),
        ("POST", "/api/v1/workers/register", b"[]"),
        ("POST", "/api/v1/workers/999/claim", None),
        ("POST", "/api/v1/runs/1/complete", b'{"worker_id": 1, "result": {"status": "meh"}}'),
    ]
    for method, path, body in odd:
        response = api.client.request(
            method, path, content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code < 500, (path, response.status_code, response.text)


def test_lease_expiry_requeues_then_fails_after_max_attempts(tmp_path: Path) -> None:
    env = {"REPRO_LEASE_SECONDS": "0.5", "REPRO_MAX_ATTEMPTS": "2"}
    service = Service(tmp_path / "data", env=env, extra=("--no-demo",))
    with running(service) as (svc, _):
        run_id = svc.submit(SEED001).json()["run"]["id"]
        quiet = svc.client_for("worker", "silent")
        silent = quiet.post("/api/v1/workers/register", json={"name": "silent"}).json()
        claim = quiet.post(f"/api/v1/workers/{silent['id']}/claim").json()
        assert claim["run"]["id"] == run_id and claim["run"]["attempt"] == 1
        time.sleep(0.7)  # no heartbeat: the lease runs out
        again = quiet.post(f"/api/v1/workers/{silent['id']}/claim").json()
        assert again["run"]["id"] == run_id and again["run"]["attempt"] == 2
        late = quiet.post(f"/api/v1/runs/{run_id}/heartbeat", json={"worker_id": silent["id"]})
        assert late.status_code == 200  # still the holder of attempt 2
        time.sleep(0.7)
        assert quiet.post(f"/api/v1/workers/{silent['id']}/claim").status_code == 204
        failed = svc.client.get(f"/api/v1/runs/{run_id}").json()
    assert failed["status"] == "failed" and failed["attempt"] == 2
    assert failed["error"]["type"] == "LeaseExpired"
    assert "gave up after 2 attempts that made no progress" in failed["error"]["message"]


def test_an_attempt_that_checkpointed_is_no_failure_and_a_run_given_up_keeps_its_checkpoints(
    tmp_path: Path,
) -> None:
    from tests.integration.test_server_verification import ProtocolWorker, npz_of, state

    env = {"REPRO_LEASE_SECONDS": "0.5", "REPRO_MAX_ATTEMPTS": "2"}
    service = Service(tmp_path / "data", env=env, extra=("--no-demo",))
    with running(service) as (svc, _):
        run_id = svc.submit(SEED001).json()["run"]["id"]
        spot = ProtocolWorker(svc, "spot-node")
        assert spot.claim() == run_id
        spot.checkpoint(run_id, 1, npz_of(state(1)), state(1))  # then the node is preempted
        for attempt in (2, 3):  # two attempts that never checkpoint
            time.sleep(0.7)
            assert spot.claim() == run_id
            assert svc.client.get(f"/api/v1/runs/{run_id}").json()["attempt"] == attempt
        time.sleep(0.7)
        assert spot.http.post(f"/api/v1/workers/{spot.id}/claim").status_code == 204
        failed = svc.client.get(f"/api/v1/runs/{run_id}").json()
        kept = svc.client.get(f"/api/v1/runs/{run_id}/artifacts").json()
    assert failed["status"] == "failed" and failed["attempt"] == 3
    assert "gave up after 2 attempts that made no progress" in failed["error"]["message"]
    assert sorted(a["name"] for a in kept) == ["epoch-000001.json", "epoch-000001.npz"]


def test_worker_sigterm_checkpoints_and_releases_then_another_finishes(tmp_path: Path) -> None:
    spec = blobs_spec(dataset={**blobs_spec()["dataset"], "batch_size": 512, "train_batches": 150})
    # About a second an epoch: enough epochs that the SIGTERM lands well before the end,
    # even when a loaded machine reports the first epoch late.
    spec["training"]["epochs"] = 12
    service = Service(tmp_path / "data", extra=("--no-demo",))
    with running(service, tmp_path / "first") as (svc, (first,)):
        run_id = svc.submit(json.dumps(spec), "application/json").json()["run"]["id"]
        deadline = time.monotonic() + 120
        while "epoch" not in (svc.client.get(f"/api/v1/runs/{run_id}").json()["progress"] or {}):
            assert time.monotonic() < deadline, "no training progress reported"
            time.sleep(0.1)
        first.stop()  # SIGTERM: checkpoint the step running, release, exit
        assert first.proc.returncode == 0
        released = svc.client.get(f"/api/v1/runs/{run_id}").json()
        assert released["status"] == "queued" and released["attempt"] == 0, released
        # Mid-epoch, a step checkpoint; a signal that lands while an epoch ends (evaluation,
        # its trace point) ends training with that epoch's checkpoint.
        step = released["checkpoint_step"]
        assert step is not None and 0 < step < 12 * 150, released
        second = svc.worker(tmp_path / "second")
        try:
            done = svc.wait_run(run_id)
        finally:
            second.stop()
    assert done["status"] == "succeeded"
    resumed = done["result_summary"]
    assert resumed["resumed_from_step"] == step
    assert resumed["resumed_from_epoch"] == (step // 150 if step % 150 == 0 else None)
    reference = run_job(spec, tmp_path / "reference")
    assert done["final_fingerprint"] == reference.result.final_fingerprint


def test_a_pinned_image_is_claimed_only_by_a_worker_that_has_it(api: Service) -> None:
    image = "registry.example/reprotrain-worker@sha256:" + "ab" * 32
    pinned = SEED001 + f"\nenvironment: {{image: '{image}'}}\n"
    created = api.submit(pinned)
    assert created.status_code == 201 and created.json()["run"]["required_image"] == image
    run_id = created.json()["run"]["id"]
    # Drain everything else first, with a worker that can run no image.
    plain_client = api.client_for("worker", "plain")
    plain = plain_client.post("/api/v1/workers/register", json={"name": "plain"}).json()
    drained = []
    while (got := plain_client.post(f"/api/v1/workers/{plain['id']}/claim")).status_code == 200:
        drained.append(got.json()["run"]["id"])
    assert run_id not in drained
    assert api.client.get(f"/api/v1/runs/{run_id}").json()["status"] == "queued"
    capable_client = api.client_for("worker", "capable")
    capable = capable_client.post(
        "/api/v1/workers/register", json={"name": "capable", "images": [image]}
    ).json()
    # A run an earlier test left claimed goes back to the queue when its lease runs out,
    # which may happen between the drain and here: the capable worker may get it first.
    for _ in range(5):
        claim = capable_client.post(f"/api/v1/workers/{capable['id']}/claim").json()
        if claim["run"]["id"] == run_id:
            break
        assert claim["run"]["image"] is None, claim
    assert claim["run"]["id"] == run_id and claim["run"]["image"] == image


def test_worker_killed_three_times_mid_epoch_still_ends_identical(tmp_path: Path) -> None:
    from tests.plugin_dist import PLUGIN_DIR, make_plugin_site

    # 20 ms a step (paced_mlp sleeps; values are untouched): each epoch of 60 steps lasts
    # over a second however fast the machine, so the test sees every attempt mid-epoch.
    spec = blobs_spec(
        dataset={**blobs_spec()["dataset"], "batch_size": 512, "train_batches": 60},
        model={"architecture": "paced_mlp", "params": {"step_seconds": 0.02}},
    )
    spec["training"]["epochs"] = 8
    plugins = [make_plugin_site(tmp_path / "site"), PLUGIN_DIR]
    paths = {"PYTHONPATH": job_env(plugins)["PYTHONPATH"]}
    env = {"REPRO_LEASE_SECONDS": "3", "REPRO_HEARTBEAT_SECONDS": "1", **paths}
    service = Service(tmp_path / "data", env=env, extra=("--no-demo",))
    with running(service) as (svc, workers):
        run_id = svc.submit(json.dumps(spec), "application/json").json()["run"]["id"]
        seen_epoch = 0
        for kill in range(3):
            worker = svc.worker(tmp_path / f"doomed-{kill}", env=paths)
            workers.append(worker)  # stopped on the way out whatever happens
            deadline = time.monotonic() + 240
            while True:  # wait for a new checkpoint, then for training to be mid-epoch
                run = svc.client.get(f"/api/v1/runs/{run_id}").json()
                progress = run["progress"] or {}
                if (
                    (run["checkpoint_epoch"] or 0) > seen_epoch
                    and progress.get("event") in ("step", "epoch_start")
                    and run["attempt"] == kill + 1
                ):
                    break
                assert run["status"] in ("running", "queued"), (kill, run["status"], run["error"])
                assert time.monotonic() < deadline, f"kill {kill}: no progress"
                time.sleep(0.05)
            seen_epoch = run["checkpoint_epoch"]
            worker.kill()
        workers.append(svc.worker(tmp_path / "survivor", env=paths))
        done = svc.wait_run(run_id)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempt"] == 4
    assert done["result_summary"]["resumed_from_epoch"] >= 3
    reference = run_job(spec, tmp_path / "reference", extra_paths=plugins)
    assert done["final_fingerprint"] == reference.result.final_fingerprint
