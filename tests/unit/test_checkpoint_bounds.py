"""Checkpoints from elsewhere are checked before anything in them is inflated."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from numpy.lib import format as npy_format

from worker.errors import CheckpointRefused
from worker.record.checkpoint import fingerprint_checkpoint, read_arrays
from worker.record.fingerprint import fingerprint_arrays

STATE = {
    "model/dense/kernel": np.arange(12, dtype=np.float32).reshape(3, 4),
    "model/dense/bias": np.ones(4, dtype=np.float64),
    "optimizer/iteration": np.array(7, dtype=np.int64),
}


def _save(path: Path, arrays: list[np.ndarray]) -> Path:
    np.savez(path, **{f"v{i}": a for i, a in enumerate(arrays)})  # type: ignore[arg-type]
    return path


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def test_a_checkpoint_fingerprints_like_the_state_it_holds(tmp_path: Path) -> None:
    npz = _save(tmp_path / "c.npz", list(STATE.values()))
    computed = fingerprint_checkpoint(npz, list(STATE), max_bytes=1024)
    assert computed == fingerprint_arrays(STATE.items())
    only = read_arrays(npz, list(STATE), ["model/dense/bias", "unknown"], max_bytes=1024)
    assert list(only) == ["model/dense/bias"]
    np.testing.assert_array_equal(only["model/dense/bias"], STATE["model/dense/bias"])


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ({"v0.npy": _npy(np.array([{"a": 1}], dtype=object))}, "not a plain number"),
        ({"v0.npy": _npy(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))}, "not a plain number"),
        ({"v0.npy": _npy(np.zeros(4, dtype=np.float32))[:-8]}, "declares 16 bytes"),
        ({"v0.npy": b"not an array"}, "no valid .npy header"),
        ({"v0.npy": _npy(np.zeros(1)), "v1.npy": _npy(np.zeros(1))}, "2 arrays where"),
        ({"v0.npy": _npy(np.zeros(300, dtype=np.float64))}, "more than 1024 bytes"),
        ({"x.npy": _npy(np.zeros(1))}, "not the 1 variables"),
    ],
)
def test_what_a_checkpoint_may_not_hold_is_refused_unread(
    tmp_path: Path, members: dict[str, bytes], reason: str
) -> None:
    npz = tmp_path / "c.npz"
    with zipfile.ZipFile(npz, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    with pytest.raises(CheckpointRefused, match=reason):
        fingerprint_checkpoint(npz, ["model/w"], max_bytes=1024)


def test_a_compressed_member_is_refused(tmp_path: Path) -> None:
    npz = tmp_path / "c.npz"
    np.savez_compressed(npz, v0=np.zeros(10, dtype=np.float32))
    with pytest.raises(CheckpointRefused, match="compressed"):
        read_arrays(npz, ["model/w"], ["model/w"], max_bytes=None)


def test_a_header_declaring_more_than_the_zip_holds_is_refused(tmp_path: Path) -> None:
    header = io.BytesIO()
    npy_format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (2**34,)}
    )
    npz = tmp_path / "c.npz"
    with zipfile.ZipFile(npz, "w") as zf:
        zf.writestr("v0.npy", header.getvalue() + b"\0" * 16)
    with pytest.raises(CheckpointRefused, match="declares 68719476736 bytes"):
        read_arrays(npz, ["model/w"], ["model/w"], max_bytes=None)
