"""The server checks what workers report: fingerprints from the uploaded weights, worker
identities, advertised images, and checkpoints that declare more than they may hold.

Workers here speak the protocol over HTTP to a real `repro serve` process (SQLite and
PostgreSQL); their checkpoints are real npz files made with NumPy and fingerprinted with
the function jobs use, or, in one test, made by a real training job.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from numpy.lib import format as npy_format

from tests.integration.jobs import REPO
from tests.integration.service_procs import Service, running
from worker.models import registry
from worker.models.model_size import training_state_layout
from worker.record.fingerprint import fingerprint_arrays
from worker.spec import parse_spec_text

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
ALLOWED_IMAGE = "registry.example/reprotrain-worker@sha256:" + "ab" * 32
# What the server may grow by (peak resident memory) while it refuses the bombs below; a
# bomb read in full would take 512 MiB or more.
RSS_BOUND = 100 * 1024**2
Arrays = dict[str, np.ndarray]


@pytest.fixture(params=["sqlite", "postgresql"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    url = None if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    env = {"REPRO_WORKER_IMAGES": json.dumps([ALLOWED_IMAGE])}
    svc = Service(tmp_path / "data", database_url=url, env=env, extra=("--no-demo",))
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


# -- a worker speaking the protocol, with checkpoints made by NumPy ---------------------------


def state(seed: int) -> Arrays:
    """A training state of the seed-001 MLP, in the order its job saves and fingerprints it
    (the server checks a final checkpoint's variables against the spec's)."""
    spec = parse_spec_text(SEED001)
    info = registry.sample_info(spec)
    assert info is not None
    layout = training_state_layout(
        spec.model.architecture,
        spec.model.params,
        info,
        optimizer=registry.OPTIMIZERS[spec.training.optimizer.name],
        optimizer_params=spec.training.optimizer.params,
    )
    rng = np.random.default_rng(seed)
    return {v.path: rng.standard_normal(v.shape).astype(v.dtype) for v in layout}


def npz_of(arrays: Arrays) -> bytes:
    """The bytes of a checkpoint npz as the job writes it (np.savez, members v0, v1, ...)."""
    buffer = io.BytesIO()
    np.savez(buffer, **{f"v{i}": a for i, a in enumerate(arrays.values())})  # type: ignore[arg-type]
    return buffer.getvalue()


def point(kind: str, epoch: int, step: int, arrays: Arrays) -> dict[str, Any]:
    fp = fingerprint_arrays(arrays.items())
    return {
        "kind": kind,
        "epoch": epoch,
        "step": step,
        "fingerprint": fp.fingerprint,
        "variables": fp.variables,
    }


class ProtocolWorker:
    """A registered worker that claims runs and reports what the test tells it to."""

    def __init__(self, svc: Service, name: str, images: list[str] | None = None) -> None:
        self.http = svc.client_for("worker", name)
        answer = self.http.post(
            "/api/v1/workers/register", json={"name": name, "images": images or []}
        )
        assert answer.status_code == 201, answer.text
        self.id = answer.json()["id"]

    def claim(self) -> int:
        answer = self.http.post(f"/api/v1/workers/{self.id}/claim")
        assert answer.status_code == 200, answer.text
        return int(answer.json()["run"]["id"])

    def upload(self, run_id: int, name: str, data: bytes, epoch: int) -> httpx.Response:
        return self.http.post(
            f"/api/v1/runs/{run_id}/artifacts",
            params={"worker_id": self.id, "kind": "checkpoint", "name": name, "epoch": epoch},
            headers={"X-Content-SHA256": hashlib.sha256(data).hexdigest()},
            content=data,
        )

    def checkpoint(self, run_id: int, epoch: int, npz: bytes, arrays: Arrays) -> None:
        manifest = [
            {"path": p, "dtype": a.dtype.name, "shape": list(a.shape)} for p, a in arrays.items()
        ]
        doc = {
            "format": 1,
            "epoch": epoch,
            "step": epoch * 7,
            "arrays": f"epoch-{epoch:06d}.npz",
            "arrays_sha256": hashlib.sha256(npz).hexdigest(),
            "manifest": manifest,
            "meta": {},
        }
        for name, data in ((f"epoch-{epoch:06d}.npz", npz), (f"epoch-{epoch:06d}.json", b"")):
            data = data or json.dumps(doc).encode()
            answer = self.upload(run_id, name, data, epoch)
            assert answer.status_code == 201, answer.text

    def complete(
        self, run_id: int, trace: list[dict[str, Any]], image: str | None = None
    ) -> httpx.Response:
        result = {
            "status": "succeeded",
            "trace": trace,
            "trace_granularity": "epoch",
            "final_fingerprint": trace[-1]["fingerprint"],
            "provenance": {"image": {"digest": image, "reference": None}},
        }
        return self.http.post(
            f"/api/v1/runs/{run_id}/complete", json={"worker_id": self.id, "result": result}
        )

    def train(
        self, run_id: int, states: list[Arrays], *, uploads: dict[int, bytes] | None = None
    ) -> list[dict[str, Any]]:
        """Checkpoint each epoch's state (or the bytes in `uploads`); the honest trace."""
        trace = [point("init", 0, 0, state(0))]
        for epoch, arrays in enumerate(states, start=1):
            npz = (uploads or {}).get(epoch) or npz_of(arrays)
            self.checkpoint(run_id, epoch, npz, arrays)
            trace.append(point("epoch", epoch, epoch * 7, arrays))
        return trace


def submit(svc: Service, key: str) -> int:
    created = svc.submit(SEED001, **{"Idempotency-Key": key})
    assert created.status_code == 201, created.text
    return int(created.json()["run"]["id"])


def run_of(svc: Service, run_id: int) -> dict[str, Any]:
    answer = svc.client.get(f"/api/v1/runs/{run_id}")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


# -- fingerprints the server recomputes --------------------------------------------------------


def test_a_wrong_final_fingerprint_fails_the_run_and_it_never_becomes_a_reference(
    service: Service,
) -> None:
    worker = ProtocolWorker(service, "liar")
    run_id = submit(service, "liar")
    assert worker.claim() == run_id
    honest = worker.train(run_id, [state(1), state(2)])
    # The trace claims other weights than the uploaded checkpoint holds.
    claimed = [*honest[:-1], point("epoch", 2, 14, state(99))]
    answer = worker.complete(run_id, claimed)
    assert answer.status_code == 200, answer.text
    run = run_of(service, run_id)
    assert run["status"] == "failed" and not run["is_reference"]
    assert run["final_fingerprint"] is None
    error = run["error"]
    assert error["type"] == "FingerprintMismatch" and "fingerprint mismatch" in error["message"]
    assert error["reported_fingerprint"] == claimed[-1]["fingerprint"]
    assert error["computed_fingerprint"] == honest[-1]["fingerprint"]
    assert len(error["variables"]) == 10 and set(error["variables"]) < set(state(0))
    checked = run["reported_by"]
    assert checked["worker"] == "liar" and checked["worker_id"] == worker.id
    assert checked["fingerprint"]["outcome"] == "mismatch"
    # A retried report gets the same answer and changes nothing.
    assert worker.complete(run_id, claimed).json()["status"] == "failed"

    # Its rerun, reported honestly, is the family's reference: the liar is nobody's.
    rerun_id = service.client.post(f"/api/v1/runs/{run_id}/rerun").json()["id"]
    assert worker.claim() == rerun_id
    trace = worker.train(rerun_id, [state(1), state(2)])
    assert worker.complete(rerun_id, trace).json()["status"] == "succeeded"
    rerun = run_of(service, rerun_id)
    assert rerun["is_reference"] and rerun["verdict"] is None
    assert rerun["final_fingerprint"] == honest[-1]["fingerprint"]
    assert rerun["reported_by"]["fingerprint"] == {
        "outcome": "verified",
        "reported": honest[-1]["fingerprint"],
        "computed": honest[-1]["fingerprint"],
        "epoch": 2,
        "checkpoint_sha256": hashlib.sha256(npz_of(state(2))).hexdigest(),
    }
    listed = service.client.get("/api/v1/runs", params={"verdict": "reference"}).json()
    assert [r["id"] for r in listed["items"]] == [rerun_id]


def test_a_run_without_its_final_checkpoint_fails(service: Service) -> None:
    worker = ProtocolWorker(service, "forgetful")
    run_id = submit(service, "forgetful")
    assert worker.claim() == run_id
    trace = worker.train(run_id, [state(1)])
    trace.append(point("epoch", 2, 14, state(2)))  # epoch 2 never uploaded
    assert worker.complete(run_id, trace).status_code == 200
    run = run_of(service, run_id)
    assert run["status"] == "failed" and run["error"]["type"] == "FinalCheckpointMissing"
    assert "final checkpoint not uploaded" in run["error"]["message"]


def test_an_honest_worker_succeeds_and_its_rerun_is_identical(tmp_path: Path) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",))
    with running(service, tmp_path / "honest") as (svc, _):
        first = svc.wait_run(submit(svc, "real"))
        assert first["status"] == "succeeded", first["error"]
        checked = first["reported_by"]["fingerprint"]
        assert checked["outcome"] == "verified" and checked["epoch"] == 3
        assert checked["computed"] == checked["reported"] == first["final_fingerprint"]
        assert first["reported_by"]["worker"] == "honest"
        second = svc.wait_run(svc.client.post(f"/api/v1/runs/{first['id']}/rerun").json()["id"])
        assert second["status"] == "succeeded" and second["verdict"] == "identical"
        assert second["final_fingerprint"] == first["final_fingerprint"]
        # The verdict's report is the comparison report: the same answer, nothing recomputed.
        compared = svc.client.get("/api/v1/compare", params={"a": first["id"], "b": second["id"]})
        assert compared.status_code == 200 and compared.json() == second["verdict_report"]


# -- comparison reports are kept ----------------------------------------------------------------


def test_a_comparison_of_finished_runs_is_computed_once(service: Service) -> None:
    worker = ProtocolWorker(service, "keeper")
    ids = [submit(service, f"keep-{n}") for n in range(3)]
    for n, run_id in enumerate(ids):  # diverged at epoch 1: the report measures the arrays
        assert worker.claim() == run_id
        trace = worker.train(run_id, [state(10 + n), state(20 + n)])
        assert worker.complete(run_id, trace).json()["status"] == "succeeded"
    pair = {"a": ids[0], "b": ids[1]}
    first = service.client.get("/api/v1/compare", params=pair)
    assert first.status_code == 200, first.text
    report = first.json()
    assert report["verdict"] == "diverged" and report["differences_measured_at"]["epoch"] == 1
    assert report["differences"] and report["differences"][0]["max_abs_diff"] > 0

    # Without any checkpoint left, the kept report still answers, unchanged ...
    shutil.rmtree(service.data_dir / "artifacts")
    second = service.client.get("/api/v1/compare", params=pair)
    assert second.status_code == 200 and second.json() == report
    # ... while a pair never compared before can no longer measure its differences.
    fresh = service.client.get("/api/v1/compare", params={"a": ids[0], "b": ids[2]}).json()
    assert fresh["verdict"] == "diverged" and not fresh["differences"]
    assert "could not be read" in fresh["differences_note"]


# -- worker identities and images --------------------------------------------------------------


def test_a_worker_name_belongs_to_one_token(service: Service) -> None:
    first, other = service.client_for("worker", "first"), service.client_for("worker", "other")
    register = "/api/v1/workers/register"
    created = first.post(register, json={"name": "gpu-1", "hostname": "a"})
    assert created.status_code == 201, created.text
    again = first.post(register, json={"name": "gpu-1", "hostname": "b"})
    assert again.status_code == 201 and again.json()["id"] == created.json()["id"]
    taken = other.post(register, json={"name": "gpu-1"})
    assert taken.status_code == 409 and "another token" in taken.json()["detail"]
    assert other.post(register, json={"name": "gpu-2"}).status_code == 201

    # Once the name's token is revoked, the name passes to the token that asks for it.
    token_id = int(str(first.headers["Authorization"]).split("_")[1])
    assert service.client.post(f"/api/v1/tokens/{token_id}/revoke").status_code == 200
    moved = other.post(register, json={"name": "gpu-1"})
    assert moved.status_code == 201 and moved.json()["id"] == created.json()["id"]


def test_images_outside_the_allow_list_are_refused_and_reports_say_who(service: Service) -> None:
    intruder = service.client_for("worker", "intruder")
    refused = intruder.post(
        "/api/v1/workers/register", json={"name": "intruder", "images": ["evil/image:latest"]}
    )
    assert refused.status_code == 403 and "REPRO_WORKER_IMAGES" in refused.json()["detail"]

    worker = ProtocolWorker(service, "pinned", images=[ALLOWED_IMAGE])
    bad_id, good_id = submit(service, "image-1"), submit(service, "image-2")
    assert worker.claim() == bad_id
    trace = worker.train(bad_id, [state(1)])
    assert worker.complete(bad_id, trace, image="evil/image@sha256:" + "0" * 64).status_code == 200
    bad = run_of(service, bad_id)
    assert bad["status"] == "failed" and bad["error"]["type"] == "ImageNotAllowed"
    assert bad["reported_by"]["image"] == "evil/image@sha256:" + "0" * 64
    assert bad["reported_by"]["image_allowed"] is False

    assert worker.claim() == good_id
    trace = worker.train(good_id, [state(1)])
    assert worker.complete(good_id, trace, image=ALLOWED_IMAGE).json()["status"] == "succeeded"
    good = run_of(service, good_id)["reported_by"]
    assert good["image"] == ALLOWED_IMAGE and good["image_allowed"] is True
    assert good["worker"] == "pinned" and good["token"] == "pinned"


# -- checkpoints that declare more than they hold ------------------------------------------------


def _npy_header(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    buffer = io.BytesIO()
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    npy_format.write_array_header_1_0(buffer, header)
    return buffer.getvalue()  # the magic string, then the header


def declaring_bomb(members: int) -> bytes:
    """A tiny npz whose first member declares 2**34 float32 elements (64 GiB)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("v0.npy", _npy_header((2**34,)) + struct.pack("<4f", 1, 2, 3, 4))
        for i in range(1, members):
            zf.writestr(f"v{i}.npy", _npy_header((1,)) + b"\0" * 4)
    return buffer.getvalue()


def inflating_bomb(members: int) -> bytes:
    """A small npz whose first member inflates about 1000 times, to 512 MiB of zeros."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("v0.npy", "w", force_zip64=True) as fh:
            fh.write(_npy_header((2**27,)))
            zeros = bytes(1 << 20)
            for _ in range(512):
                fh.write(zeros)
        for i in range(1, members):
            zf.writestr(f"v{i}.npy", _npy_header((1,)) + b"\0" * 4)
    return buffer.getvalue()


def _memory(pid: int) -> dict[str, int]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in lines)
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM")}


def test_bomb_checkpoints_are_refused_within_bounded_memory(service: Service) -> None:
    worker = ProtocolWorker(service, "bomber")
    members = len(state(0))
    before = _memory(service.proc.pid)
    bombs = {
        "declares 68719476736 bytes": declaring_bomb(members),
        "compressed": inflating_bomb(members),
    }
    for n, (reason, bomb) in enumerate(bombs.items()):
        assert len(bomb) < 1024**2
        run_id = submit(service, f"bomb-{n}")
        assert worker.claim() == run_id
        trace = worker.train(run_id, [state(1)], uploads={1: bomb})
        answer = worker.complete(run_id, trace)
        assert answer.status_code == 422, answer.text
        assert "final checkpoint refused" in answer.json()["detail"]
        assert reason in answer.json()["detail"]
        run = run_of(service, run_id)
        assert run["status"] == "failed" and run["error"]["type"] == "CheckpointRefused"
        assert not run["is_reference"]

    # A bomb among the earlier checkpoints of two succeeded runs: reading it to measure
    # their divergence is refused too, on every request.
    ids = [submit(service, f"diverging-{n}") for n in range(2)]
    for n, run_id in enumerate(ids):
        assert worker.claim() == run_id
        uploads = {1: inflating_bomb(members)} if n == 0 else {}
        trace = worker.train(run_id, [state(30 + n), state(40 + n)], uploads=uploads)
        assert worker.complete(run_id, trace).json()["status"] == "succeeded"
    for _ in range(2):
        compared = service.client.get("/api/v1/compare", params={"a": ids[0], "b": ids[1]})
        assert compared.status_code == 422, compared.text
        assert f"run {ids[0]}, checkpoint of epoch 1" in compared.json()["detail"]

    after = _memory(service.proc.pid)
    grown = after["VmHWM"] - max(before["VmHWM"], before["VmRSS"])
    print(f"\nserver peak RSS {after['VmHWM'] / 1024**2:.0f} MiB, grown {grown / 1024**2:.1f} MiB")
    assert grown < RSS_BOUND, f"peak memory grew {grown / 1024**2:.0f} MiB"
    # The next ordinary requests are served.
    assert service.client.get("/healthz").status_code == 200
    assert service.client.get("/api/v1/runs").status_code == 200
    assert run_of(service, ids[1])["status"] == "succeeded"
