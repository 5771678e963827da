"""Checkpoints: exact round trip, and damaged or foreign checkpoints are never restored."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from worker.errors import CheckpointError
from worker.record import checkpoint
from worker.record.checkpoint import (
    Syncer,
    list_checkpoints,
    load_checkpoint,
    load_latest,
    restore,
    save_checkpoint,
)


class Var:
    """The slice of a framework variable the checkpoint module uses: numpy/assign/shape."""

    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    def numpy(self) -> np.ndarray:
        return self.value.copy()

    def assign(self, value: np.ndarray) -> None:
        assert value.dtype == self.value.dtype and value.shape == self.value.shape
        self.value = value.copy()


def _state(scale: float) -> list[tuple[str, Var]]:
    rng = np.random.default_rng(int(scale * 10))
    return [
        ("model/w", Var(rng.standard_normal((3, 4)).astype(np.float32) * scale)),
        ("model/seed", Var(np.array([5, 9], dtype=np.int64))),
        ("optimizer/iteration", Var(np.array(12, dtype=np.int64))),
    ]


def _save(directory: Path, epoch: int, scale: float, spec_hash: str = "sha256:s") -> None:
    save_checkpoint(
        directory,
        epoch=epoch,
        step=epoch * 10,
        state=_state(scale),
        meta={"spec_hash": spec_hash, "fingerprint": f"fp{epoch}"},
    )


def test_round_trip_is_bit_exact(tmp_path: Path) -> None:
    _save(tmp_path, 1, 1.0)
    target = _state(2.0)
    ckpt, warnings = load_latest(tmp_path, spec_hash="sha256:s")
    assert ckpt is not None and warnings == [] and (ckpt.epoch, ckpt.step) == (1, 10)
    restore(ckpt, target)
    for (_, want), (_, got) in zip(_state(1.0), target, strict=True):
        assert got.value.dtype == want.value.dtype
        assert got.value.tobytes() == want.value.tobytes()


def test_newest_intact_checkpoint_wins_and_damage_is_skipped(tmp_path: Path) -> None:
    for epoch in (1, 2, 3):
        _save(tmp_path, epoch, float(epoch))
    (tmp_path / "epoch-000003.npz").write_bytes(b"truncated")
    ckpt, warnings = load_latest(tmp_path, spec_hash="sha256:s")
    assert ckpt is not None and ckpt.epoch == 2
    assert len(warnings) == 1 and "epoch-000003.npz" in warnings[0]


def test_a_checkpoint_without_its_json_does_not_exist(tmp_path: Path) -> None:
    _save(tmp_path, 1, 1.0)
    _save(tmp_path, 2, 2.0)
    (tmp_path / "epoch-000002.json").unlink()  # a crash between the two writes
    assert [p.name for p in list_checkpoints(tmp_path)] == ["epoch-000001.json"]
    ckpt, _ = load_latest(tmp_path, spec_hash="sha256:s")
    assert ckpt is not None and ckpt.epoch == 1


def test_checkpoints_of_another_spec_are_not_used(tmp_path: Path) -> None:
    _save(tmp_path, 1, 1.0, spec_hash="sha256:other")
    ckpt, warnings = load_latest(tmp_path, spec_hash="sha256:s")
    assert ckpt is None and "another spec" in warnings[0]


def test_restore_refuses_a_different_model(tmp_path: Path) -> None:
    _save(tmp_path, 1, 1.0)
    ckpt = load_checkpoint(tmp_path / "epoch-000001.json")
    with pytest.raises(CheckpointError, match="do not match"):
        restore(ckpt, _state(1.0)[:2])
    renamed = [("model/v", v) if p == "model/w" else (p, v) for p, v in _state(1.0)]
    with pytest.raises(CheckpointError):
        restore(ckpt, renamed)


def test_no_temporary_files_are_left(tmp_path: Path) -> None:
    _save(tmp_path, 1, 1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-000001.json", "epoch-000001.npz"]


def test_a_checkpoint_synced_in_the_background_is_whole_when_saving_returns(tmp_path: Path) -> None:
    syncer = Syncer()
    json_path = save_checkpoint(
        tmp_path,
        epoch=1,
        step=10,
        state=_state(1.0),
        meta={"spec_hash": "sha256:s", "fingerprint": "fp1"},
        syncer=syncer,
    )
    ckpt = load_checkpoint(json_path)  # readable at once, with its fsyncs not waited for
    assert [a.tobytes() for a in ckpt.arrays] == [v.value.tobytes() for _, v in _state(1.0)]
    syncer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-000001.json", "epoch-000001.npz"]


def test_a_failed_background_sync_fails_on_close(tmp_path: Path) -> None:
    syncer = Syncer()
    syncer.sync(tmp_path / "gone.npz")  # removed before it could be synced
    with pytest.raises(CheckpointError, match="could not be synced"):
        syncer.close()


def test_states_packed_in_memory_or_on_the_file_write_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small states are packed in memory and hashed there, large ones written and read back:
    the same files and digests either way, each digest the file's."""
    for name, limit in (("memory", checkpoint.PACK_IN_MEMORY_BYTES), ("file", 0)):
        monkeypatch.setattr(checkpoint, "PACK_IN_MEMORY_BYTES", limit)
        _save(tmp_path / name, epoch=1, scale=2.0)
    memory, file = tmp_path / "memory" / "epoch-000001", tmp_path / "file" / "epoch-000001"
    packed = memory.with_suffix(".npz").read_bytes()
    assert packed == file.with_suffix(".npz").read_bytes()
    for stem in (memory, file):
        doc = json.loads(stem.with_suffix(".json").read_text())
        assert doc["arrays_sha256"] == hashlib.sha256(packed).hexdigest()
    restored = _state(0.0)
    restore(load_checkpoint(memory.with_suffix(".json")), restored)
    for (_, got), (_, want) in zip(restored, _state(2.0), strict=True):
        assert got.value.tobytes() == want.value.tobytes()
