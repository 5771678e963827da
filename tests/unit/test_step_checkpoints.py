"""Step checkpoints beside epoch checkpoints: names, resume order, and foreign ones skipped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from worker.record.checkpoint import (
    checkpoint_epoch,
    checkpoint_step,
    list_checkpoints,
    load_latest,
    save_checkpoint,
)


class Var:
    def __init__(self, value: np.ndarray) -> None:
        self.value = value
        self.shape = value.shape

    def numpy(self) -> np.ndarray:
        return self.value.copy()


def _save(directory: Path, *, epoch: int, step: int, batch: int | None, replicas: int = 1) -> Path:
    state = [("model/w", Var(np.full((2, 2), step, dtype=np.float32)))]
    meta = {"spec_hash": "sha256:s", "replicas": replicas, "fingerprint": f"fp{step}"}
    return save_checkpoint(directory, epoch=epoch, step=step, batch=batch, state=state, meta=meta)


def test_step_checkpoints_are_named_by_global_step_and_record_the_batch(tmp_path: Path) -> None:
    path = _save(tmp_path, epoch=2, step=37, batch=17)
    assert path.name == "step-000000037.json" and (tmp_path / "step-000000037.npz").exists()
    doc = json.loads(path.read_text())
    assert (doc["kind"], doc["epoch"], doc["batch"], doc["step"]) == ("step", 2, 17, 37)
    assert checkpoint_step(path.name) == 37 and checkpoint_epoch(path.name) is None
    assert checkpoint_step("epoch-000002.json") is None


def test_resume_takes_the_newest_global_step_of_either_kind(tmp_path: Path) -> None:
    _save(tmp_path, epoch=1, step=10, batch=10)
    _save(tmp_path, epoch=1, step=20, batch=None)  # the end of epoch 1 (20 steps)
    _save(tmp_path, epoch=2, step=20, batch=0)  # same step: the epoch checkpoint wins
    order = [p.name for p in list_checkpoints(tmp_path)]
    assert order[0] == "step-000000010.json" and order[-1] == "epoch-000001.json"
    ckpt, warnings = load_latest(tmp_path, spec_hash="sha256:s")
    assert ckpt is not None and ckpt.kind == "epoch" and ckpt.step == 20 and warnings == []

    _save(tmp_path, epoch=2, step=30, batch=10)
    ckpt, _ = load_latest(tmp_path, spec_hash="sha256:s")
    assert ckpt is not None and (ckpt.kind, ckpt.epoch, ckpt.batch, ckpt.step) == (
        "step",
        2,
        10,
        30,
    )
    assert ckpt.arrays[0][0, 0] == 30


def test_a_checkpoint_of_another_replica_count_is_skipped_unread(tmp_path: Path) -> None:
    _save(tmp_path, epoch=1, step=10, batch=10, replicas=1)
    _save(tmp_path, epoch=1, step=20, batch=20, replicas=2)
    (tmp_path / "step-000000020.npz").write_bytes(b"never read")
    ckpt, warnings = load_latest(tmp_path, spec_hash="sha256:s", replicas=1)
    assert ckpt is not None and ckpt.step == 10
    assert warnings == [
        "skipped checkpoint step-000000020.json: it was written with 2 replica(s), this job has 1"
    ]


def test_epoch_checkpoints_written_before_step_checkpoints_still_load(tmp_path: Path) -> None:
    path = _save(tmp_path, epoch=3, step=30, batch=None)
    doc = json.loads(path.read_text())
    del doc["kind"]
    del doc["meta"]["replicas"]
    path.write_text(json.dumps(doc))
    ckpt, warnings = load_latest(tmp_path, spec_hash="sha256:s")
    assert ckpt is not None and ckpt.kind == "epoch" and ckpt.batch is None and warnings == []
