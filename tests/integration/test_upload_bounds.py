"""What one run may upload is bounded, and what can serve no resume is pruned.

A real server on SQLite and on PostgreSQL, a worker speaking the protocol over HTTP, and
the files the server stores counted on disk.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.persistence.engine import make_engine, make_sessionmaker
from service.persistence.models import Artifact, Experiment, Run
from service.runs import resume_points
from service.storage import artifacts
from service.storage.blob_store import LocalStore, stored_path
from tests.integration.jobs import blobs_spec
from tests.integration.service_procs import Service


class _Worker:
    """A registered worker holding one claimed run, uploading what the test tells it to."""

    def __init__(self, service: Service) -> None:
        self.http = service.client_for("worker", "uploader")
        answer = self.http.post("/api/v1/workers/register", json={"name": "uploader"})
        assert answer.status_code == 201, answer.text
        self.id = answer.json()["id"]
        submitted = service.submit(json.dumps(blobs_spec()), "application/json")
        assert submitted.status_code == 201, submitted.text
        claimed = self.http.post(f"/api/v1/workers/{self.id}/claim")
        assert claimed.status_code == 200, claimed.text
        self.run_id = int(claimed.json()["run"]["id"])

    def upload(self, kind: str, name: str, data: bytes, epoch: int | None = None) -> httpx.Response:
        params: dict[str, str | int] = {"worker_id": self.id, "kind": kind, "name": name}
        if epoch is not None:
            params["epoch"] = epoch
        return self.http.post(
            f"/api/v1/runs/{self.run_id}/artifacts",
            params=params,
            headers={"X-Content-SHA256": hashlib.sha256(data).hexdigest()},
            content=data,
        )


def _stored_files(data_dir: Path) -> list[Path]:
    store = data_dir / "artifacts"
    return [
        p
        for p in store.rglob("*")
        if p.is_file() and not p.name.startswith(".") and "datasets" not in p.parts
    ]


def _names(service: Service, run_id: int) -> set[str]:
    return {a["name"] for a in service.client.get(f"/api/v1/runs/{run_id}/artifacts").json()}


@pytest.fixture
def bounded(database_url: str | None, tmp_path: Path) -> Service:
    limits = {"REPRO_MAX_RUN_ARTIFACT_FILES": "3", "REPRO_MAX_RUN_ARTIFACT_BYTES": "4096"}
    service = Service(
        tmp_path / "data", database_url=database_url, env=limits, extra=("--no-demo",)
    )
    return service.wait_ready()


def test_uploads_past_a_run_s_bounds_are_refused_and_nothing_is_stored(
    bounded: Service, tmp_path: Path
) -> None:
    try:
        worker = _Worker(bounded)
        # Checkpoint halves count (a step npz whose json never came): 3 files at most...
        for step in (1, 2, 3):
            name = f"step-{step:09d}.npz"
            assert worker.upload("checkpoint", name, name.encode()).status_code == 201
        files = len(_stored_files(tmp_path / "data"))
        refused = worker.upload("checkpoint", "step-000000005.npz", b"arrays")
        assert refused.status_code == 413 and "REPRO_MAX_RUN_ARTIFACT_FILES" in refused.text
        # ...the same name again replaces its file: no more files, and the old bytes are gone.
        assert worker.upload("checkpoint", "step-000000001.npz", b"y" * 3000).status_code == 201
        assert len(_stored_files(tmp_path / "data")) == files
        # Bytes: 3,000 + 18 of 4,096 taken, so 2,000 more are refused as they arrive.
        refused = worker.upload("checkpoint", "step-000000002.npz", b"v" * 2000)
        assert refused.status_code == 413 and "REPRO_MAX_RUN_ARTIFACT_BYTES" in refused.text

        # What else a run holds is its one exported model: no logs, no other kinds.
        assert worker.upload("model", "model.keras", b"m" * 100).status_code == 201
        refused = worker.upload("model", "second.keras", b"m")
        assert refused.status_code == 400 and "model.keras" in refused.text
        for kind in ("log", "weights"):
            assert worker.upload(kind, f"{kind}-0", b"x").status_code == 422

        # The epoch checkpoints the spec writes (4 epochs) are not counted, and once one is
        # in, the halves before it serve no resume and go.
        for epoch in range(1, 5):
            for ext in ("npz", "json"):
                name = f"epoch-{epoch:06d}.{ext}"
                answer = worker.upload("checkpoint", name, f"{name}".encode(), epoch)
                assert answer.status_code == 201, answer.text

        names = _names(bounded, worker.run_id)
        assert not names & {"second.keras", "log-0", "step-000000005.npz", "step-000000001.npz"}
        assert names == {"model.keras"} | {
            f"epoch-{epoch:06d}.{ext}" for epoch in range(1, 5) for ext in ("npz", "json")
        }
        assert len(_stored_files(tmp_path / "data")) == len(names)  # every byte distinct
    finally:
        bounded.stop()


@pytest.mark.parametrize("policy", ["final", "all"])
def test_checkpoint_halves_that_serve_no_resume_are_pruned(
    database_url: str | None, tmp_path: Path, policy: str
) -> None:
    data_dir = tmp_path / "data"
    env = {"REPRO_KEEP_CHECKPOINTS": policy}
    service = Service(data_dir, database_url=database_url, extra=("--no-demo",), env=env)
    service.wait_ready()
    try:
        worker = _Worker(service)
        run_id = worker.run_id
        # An npz whose json never came, then a complete checkpoint past it: the half goes.
        assert worker.upload("checkpoint", "step-000000002.npz", b"half").status_code == 201
        for ext in ("npz", "json"):
            name = f"step-000000004.{ext}"
            assert worker.upload("checkpoint", name, name.encode()).status_code == 201
        assert "step-000000002.npz" not in _names(service, run_id)
        for ext in ("npz", "json"):
            name = f"epoch-000001.{ext}"
            assert worker.upload("checkpoint", name, name.encode(), 1).status_code == 201
        # Halves past the newest complete checkpoint wait: their json may still come.
        for step in range(7, 27):
            name = f"step-{step:09d}.npz"
            assert worker.upload("checkpoint", name, name.encode()).status_code == 201
        assert worker.upload("model", "model.keras", b"the model").status_code == 201
        # Under `final` step-4 went, epoch 1 superseding it; `all` keeps it for spot checks.
        kept_step = 2 if policy == "all" else 0
        assert len(_stored_files(data_dir)) == 2 + kept_step + 20 + 1

        failed = worker.http.post(
            f"/api/v1/runs/{run_id}/fail",
            json={"worker_id": worker.id, "error": {"type": "Crash", "message": "gone"}},
        )
        assert failed.status_code == 200, failed.text
        # Failed, so never spot-checked: only its complete epoch checkpoint and model are left.
        names = _names(service, run_id)
        assert names == {"epoch-000001.npz", "epoch-000001.json", "model.keras"}
        assert len(_stored_files(data_dir)) == 3
    finally:
        service.stop()


def _run(db: Session) -> Run:
    spec = {"dataset": {"train_batches": 10}, "training": {"epochs": 2}}
    experiment = Experiment(
        name="e", spec=spec, spec_hash="h", submitted_spec_hash="h", seed=[1, 0], seed_source="spec"
    )
    run = Run(experiment=experiment, status="running")
    db.add(run)
    db.commit()
    return run


def test_a_run_uploading_bytes_another_run_s_finish_prunes_keeps_its_file(
    migrated_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs upload the same bytes as an orphan half; the first finishes and its prune is
    about to unlink the shared file when the second run's upload lands: the file stays."""
    engine = make_engine(migrated_settings.resolved_database_url)
    store = tmp_path / "store"
    body = b"the same arrays"
    digest = hashlib.sha256(body).hexdigest()
    bounds = artifacts.upload_bounds
    try:
        with make_sessionmaker(engine)() as db:
            run, other = _run(db), _run(db)
            orphan = stored_path(store, digest)
            orphan.parent.mkdir(parents=True)
            orphan.write_bytes(body)
            db.add(
                Artifact(
                    run_id=run.id,
                    kind="checkpoint",
                    name="step-000000003.npz",
                    sha256=digest,
                    size=len(body),
                    storage_url=orphan.resolve().as_uri(),
                    attempt=1,
                )
            )
            db.commit()
            staged = tmp_path / ".upload.part"
            staged.write_bytes(body)

            def upload() -> None:
                with Session(engine) as second:
                    held = second.get(Run, other.id)
                    assert held is not None
                    artifacts.record(
                        db=second,
                        run=held,
                        kind="checkpoint",
                        name="step-000000003.npz",
                        epoch=None,
                        sha256=digest,
                        size=len(body),
                        place=lambda: LocalStore(store).put_file("artifacts", digest, staged),
                        bounds=bounds(held, migrated_settings),
                    )

            uploader = threading.Thread(target=upload)
            unlink = Path.unlink

            def unlink_after_the_upload(path: Path, missing_ok: bool = False) -> None:
                if path == orphan and not uploader.is_alive() and staged.exists():
                    uploader.start()
                    uploader.join(timeout=2)  # done unless it waits for this prune
                unlink(path, missing_ok=missing_ok)

            monkeypatch.setattr(Path, "unlink", unlink_after_the_upload)
            assert resume_points.prune_step_checkpoints(db, run, keep_newest=False) == 1
            uploader.join(timeout=30)
            monkeypatch.undo()
            assert not uploader.is_alive() and not staged.exists()
            assert orphan.read_bytes() == body
            kept = db.scalars(select(Artifact.run_id).where(Artifact.sha256 == digest)).all()
            assert kept == [other.id]
    finally:
        engine.dispose()
