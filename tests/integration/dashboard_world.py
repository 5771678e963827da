"""A database with the runs an auditor looks at: a family with an identical and a diverged
rerun, a failed run, a running one, a worker, an artifact, an audit, hostile strings.

Rows are written through the service's models and its own verdict code (what the service
does on completion), so the pages render what a real service stores.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from service.auth import tokens as auth
from service.config import Settings
from service.persistence.models import Artifact, Run, TracePointRow, Worker, utcnow
from service.runs import final_metrics
from service.runs.experiments import create_experiment
from service.verification import verdicts
from worker.spec import ExperimentSpec

HOSTILE = "<script>alert(1)</script>"
HOSTILE_ERROR = '<img src=x onerror="alert(2)">'
HOSTILE_ENV = "</td><script>alert(3)</script>"
VARIABLES = ["model/hidden/kernel", "model/hidden/bias", "model/output/kernel", "model/output/bias"]
DIVERGENT = "model/hidden/kernel"


def spec_doc(name: str = HOSTILE, epochs: int = 3) -> dict[str, Any]:
    return {
        "name": name,
        "seed": 42,
        "dataset": {
            "generator": "gaussian_blobs",
            "params": {"num_features": 4, "num_classes": 2},
            "batch_size": 16,
            "train_batches": 4,
        },
        "model": {"architecture": "mlp", "params": {"hidden": [8]}},
        "training": {
            "epochs": epochs,
            "optimizer": {"name": "adam", "params": {"learning_rate": 0.001}},
            "loss": {"name": "sparse_categorical_crossentropy", "params": {"from_logits": True}},
            "metrics": ["accuracy"],
        },
    }


def provenance(seed: list[int], *, env_value: str = HOSTILE_ENV) -> dict[str, Any]:
    return {
        "seed": seed,
        "package": {"name": "reprotrain", "version": "0.1.0", "git_commit": "ab" * 20},
        "image": {"reference": None, "digest": None, "in_container": True},
        "python": {"version": "3.11.7", "implementation": "CPython"},
        "libraries": {"tensorflow": "2.21.0", "keras": "3.15.1", "numpy": "2.4.6"},
        "cuda": {"build": {"is_cuda_build": False}, "loaded": {"driver_version": None}},
        "gpus": [],
        "cpu": {"model": "AMD EPYC", "logical_cores": 2, "machine": "x86_64"},
        "os": {"system": "Linux", "libc": "glibc 2.36"},
        "threads": {"intra_op": 0, "inter_op": 0, "omp_num_threads": None},
        "determinism": {
            "python_hash_seed": "0",
            "op_determinism": True,
            "seeded": ["python.random", "numpy.random", "tf.random", "keras"],
            "init_seed": 840851303,
            "reseed": "every epoch from (seed, 'epoch', epoch)",
            "intra_op_threads": 0,
            "inter_op_threads": 0,
        },
        "environment": {"PYTHONHASHSEED": "0", "TF_DETERMINISTIC_OPS": "1", "NOTE": env_value},
        "packages": {"count": 107, "digest": "sha256:" + "cd" * 32},
    }


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def trace(epochs: int, *, diverge_at: int | None = None) -> list[dict[str, Any]]:
    """Trace points init, epoch 1..n; from `diverge_at` on, DIVERGENT's digest differs."""
    points = []
    for epoch in range(epochs + 1):
        tag = "b" if diverge_at is not None and epoch >= diverge_at else "a"
        variables = {v: _digest(v, epoch, tag if v == DIVERGENT else "a") for v in VARIABLES}
        points.append(
            {
                "kind": "init" if epoch == 0 else "epoch",
                "epoch": epoch,
                "step": epoch * 4,
                "fingerprint": "blake3:" + _digest(sorted(variables.items())),
                "variables": variables,
            }
        )
    return points


def finish(
    db: Session,
    run: Run,
    worker: Worker,
    *,
    diverge_at: int | None = None,
    epochs: int = 3,
) -> None:
    """Record a successful job on `run`, as completion does, and give its family verdicts."""
    now = utcnow()
    points = trace(epochs, diverge_at=diverge_at)
    run.status, run.worker_id, run.attempt = "succeeded", worker.id, 1
    run.started_at, run.finished_at = now - timedelta(seconds=42), now
    run.final_fingerprint = points[-1]["fingerprint"]
    run.trace_granularity = "epoch"
    run.provenance = provenance(list(run.experiment.seed))
    run.metrics = [
        {"epoch": e, "step": 4 * e, "loss": 0.7 - e / 50 + (0.01 if diverge_at else 0),
         "accuracy": 0.5 + e / 40}
        for e in range(1, epochs + 1)
    ]  # fmt: skip
    final_metrics.record(db, run, max_names=64)
    run.data_fingerprints = [
        {"epoch": e, "fingerprint": "sha256:" + _digest("data", e)} for e in range(1, epochs + 1)
    ]
    run.result_summary = {"warnings": [], "determinism": run.provenance["determinism"]}
    db.add_all(
        TracePointRow(run_id=run.id, seq=i, **{k: p[k] for k in p}) for i, p in enumerate(points)
    )
    db.flush()
    verdicts.update_family(db=db, family_id=run.family_id or run.id)
    db.commit()


@dataclass
class World:
    reference: int
    identical: int
    diverged: int
    failed: int
    running: int
    audit: int
    experiment: int
    artifact: int
    worker: str
    admin_token: str
    submitter_token: str
    viewer_token: str


def build(db: Session, artifacts_dir: Path, settings: Settings) -> World:
    """Fill an empty, migrated database with the world the dashboard tests look at."""
    _, admin = auth.create_token(db=db, name="admin", role="admin")
    _, submitter = auth.create_token(db=db, name="submitter", role="submitter")
    _, viewer = auth.create_token(db=db, name=HOSTILE, role="viewer")
    worker = Worker(name="gpu-box-1", hostname="box", executors=["process"], images=[], gpu=None)
    db.add(worker)
    db.commit()
    spec = ExperimentSpec.model_validate(spec_doc())
    experiment, reference, _ = create_experiment(db=db, spec=spec, settings=settings)
    finish(db, reference, worker)
    identical = rerun(db, reference)
    finish(db, identical, worker)
    diverged = rerun(db, reference)
    finish(db, diverged, worker, diverge_at=2)
    failed = rerun(db, reference)
    failed.status, failed.worker_id = "failed", worker.id
    failed.started_at = failed.finished_at = utcnow()
    failed.error = {
        "type": "ValueError",
        "message": HOSTILE_ERROR,
        "traceback": f"Traceback (most recent call last):\n  raise ValueError({HOSTILE_ERROR!r})",
    }
    running = rerun(db, reference)
    running.status, running.worker_id, running.started_at = "running", worker.id, utcnow()
    running.progress = {"event": "epoch_end", "epoch": 1, "step": 4, "loss": 0.69}
    db.commit()
    _, audit_run, _ = create_experiment(db=db, spec=spec, copies=2, settings=settings)
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    data = b"final weights " + HOSTILE.encode()
    path = artifacts_dir / "weights.npz"
    path.write_bytes(data)
    art = Artifact(
        run_id=reference.id,
        kind="final",
        name="weights.npz",
        epoch=None,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        storage_url=path.resolve().as_uri(),
        attempt=1,
    )
    db.add(art)
    db.commit()
    return World(
        reference=reference.id,
        identical=identical.id,
        diverged=diverged.id,
        failed=failed.id,
        running=running.id,
        audit=audit_run.id,
        experiment=experiment.id,
        artifact=art.id,
        worker=worker.name,
        admin_token=admin,
        submitter_token=submitter,
        viewer_token=viewer,
    )


def rerun(db: Session, original: Run) -> Run:
    """A queued rerun of `original` in its family."""
    run = Run(
        experiment_id=original.experiment_id,
        rerun_of_id=original.id,
        family_id=original.family_id or original.id,
        status="queued",
    )
    db.add(run)
    db.flush()
    db.refresh(run)
    return run
