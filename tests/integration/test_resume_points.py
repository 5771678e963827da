"""The resume point a claim offers, and the step checkpoints the server lets go of.

Against a real database (SQLite and PostgreSQL) built by the migrations, with artifact
files on disk as the upload route stores them (content-addressed).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.persistence.engine import make_engine, make_sessionmaker
from service.persistence.migrate import upgrade
from service.persistence.models import Artifact, Experiment, Run
from service.runs import resume_points
from service.storage import artifacts
from service.storage.blob_store import LocalStore

STEPS_PER_EPOCH = 10


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Session]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'resume.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    upgrade(url)
    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as session:
            yield session
    finally:
        engine.dispose()


def _run(db: Session, **options: int) -> Run:
    spec = {"dataset": {"train_batches": STEPS_PER_EPOCH}}
    experiment = Experiment(
        name="e", spec=spec, spec_hash="h", submitted_spec_hash="h", seed=[1, 0], seed_source="spec"
    )
    run = Run(experiment=experiment, status="running", job_options=options or None)
    db.add(run)
    db.commit()
    return run


def _upload(db: Session, store: Path, run: Run, name: str, epoch: int | None, body: bytes) -> Path:
    digest = hashlib.sha256(body).hexdigest()
    path = store / digest[:2] / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    db.add(
        Artifact(
            run_id=run.id,
            kind="checkpoint",
            name=name,
            epoch=epoch,
            sha256=digest,
            size=len(body),
            storage_url=path.resolve().as_uri(),
            attempt=1,
        )
    )
    db.commit()
    return path


def _checkpoint(db: Session, store: Path, run: Run, stem: str, epoch: int | None) -> Path:
    npz = _upload(db, store, run, f"{stem}.npz", epoch, f"{run.id} {stem} arrays".encode())
    _upload(db, store, run, f"{stem}.json", epoch, f"{run.id} {stem} manifest".encode())
    return npz


def test_the_newest_complete_checkpoint_by_global_step_is_the_resume_point(
    db: Session, tmp_path: Path
) -> None:
    run = _run(db)
    assert resume_points.resume_point(db, run) is None
    _checkpoint(db, tmp_path, run, "epoch-000001", 1)
    _checkpoint(db, tmp_path, run, "step-000000014", None)
    # Only its arrays are in (the json comes last): not a checkpoint yet.
    _upload(db, tmp_path, run, "step-000000018.npz", None, b"half")
    point = resume_points.resume_point(db, run)
    assert point is not None
    assert (point.kind, point.epoch, point.step) == ("step", 1, 14)
    assert [a.name for a in point.files] == ["step-000000014.npz", "step-000000014.json"]
    # At one global step, the epoch checkpoint wins: its epoch is finished.
    _checkpoint(db, tmp_path, run, "step-000000020", None)
    _checkpoint(db, tmp_path, run, "epoch-000002", 2)
    point = resume_points.resume_point(db, run)
    assert point is not None and (point.kind, point.epoch, point.step) == ("epoch", 2, 20)


def test_a_retrace_starts_from_the_named_epoch_of_the_run_it_retraces(
    db: Session, tmp_path: Path
) -> None:
    source = _run(db)
    _checkpoint(db, tmp_path, source, "epoch-000001", 1)
    _checkpoint(db, tmp_path, source, "epoch-000002", 2)
    _checkpoint(db, tmp_path, source, "step-000000025", None)
    retrace = _run(db, resume_from_run=source.id, resume_from_epoch=1)
    point = resume_points.resume_point(db, retrace)
    assert point is not None and (point.kind, point.epoch, point.npz.run_id) == (
        "epoch",
        1,
        source.id,
    )


def test_superseded_step_checkpoints_are_deleted_but_shared_files_stay(
    db: Session, tmp_path: Path
) -> None:
    run, other = _run(db), _run(db)
    old = _checkpoint(db, tmp_path, run, "step-000000004", None)
    newer = _checkpoint(db, tmp_path, run, "step-000000008", None)
    # Another run stored the same bytes as the newer one: one file, two artifacts.
    _upload(db, tmp_path, other, "shared.npz", None, newer.read_bytes())

    assert resume_points.prune_step_checkpoints(db, run) == 1
    names = set(db.scalars(select(Artifact.name).where(Artifact.run_id == run.id)))
    assert names == {"step-000000008.npz", "step-000000008.json"}
    assert not old.exists() and newer.exists()

    epoch = _checkpoint(db, tmp_path, run, "epoch-000001", 1)
    assert resume_points.prune_step_checkpoints(db, run, keep_newest=False) == 1
    names = set(db.scalars(select(Artifact.name).where(Artifact.run_id == run.id)))
    assert names == {"epoch-000001.npz", "epoch-000001.json"}  # epoch checkpoints stay
    assert epoch.exists() and newer.exists()  # still the other run's artifact


def test_an_upload_of_the_same_bytes_while_a_prune_removes_them_keeps_its_file(
    db: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files are content-addressed: a prune that found no other artifact of a digest is
    about to unlink its file when another run uploads the same bytes. The upload must
    either wait for the prune and put the file back, or be seen by it: its file exists."""
    run, other = _run(db), _run(db)
    old = _checkpoint(db, tmp_path, run, "step-000000004", None)
    _checkpoint(db, tmp_path, run, "step-000000008", None)
    body = old.read_bytes()
    staged = tmp_path / ".upload.part"
    staged.write_bytes(body)
    digest = hashlib.sha256(body).hexdigest()
    engine = db.get_bind()

    def upload() -> None:
        with Session(engine) as second:
            artifacts.record(
                db=second,
                run=second.get(Run, other.id),
                kind="checkpoint",
                name="same-bytes.npz",
                epoch=None,
                sha256=digest,
                size=len(body),
                place=lambda: LocalStore(tmp_path).put_file("artifacts", digest, staged),
            )

    uploader = threading.Thread(target=upload)
    unlink = Path.unlink

    def unlink_after_the_upload(path: Path, missing_ok: bool = False) -> None:
        if path == old and not uploader.is_alive() and staged.exists():
            uploader.start()
            uploader.join(timeout=2)  # done unless it waits for this prune
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink_after_the_upload)
    assert resume_points.prune_step_checkpoints(db, run) == 1
    uploader.join(timeout=30)
    assert not uploader.is_alive() and not staged.exists()
    assert old.read_bytes() == body
    names = set(db.scalars(select(Artifact.name).where(Artifact.run_id == other.id)))
    assert names == {"same-bytes.npz"}
