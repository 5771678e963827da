"""Dataset files are described and refused with a reason before anything trusts them."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from worker.data.dataset_format import (
    ArrayInfo,
    DatasetFormatError,
    file_digest,
    inspect_dataset,
    open_arrays,
)

X = np.arange(5 * 8 * 8, dtype=np.float32).reshape(5, 8, 8, 1)
Y = np.array([0, 1, 2, 1, 0], dtype=np.int64)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _zip(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_an_npz_is_described_and_opened_as_saved(tmp_path: Path, save: object) -> None:
    path = tmp_path / "d.npz"
    save(path, x=X, y=Y, mask=np.ones(5, dtype=bool))  # type: ignore[operator]
    info = inspect_dataset(path)
    assert info.format == "npz"
    assert info.samples == 5
    assert info.arrays == (
        ArrayInfo("x", (5, 8, 8, 1), "float32"),
        ArrayInfo("y", (5,), "int64", low=0, high=2),  # an integer array's range is read too
        ArrayInfo("mask", (5,), "bool"),
    )
    arrays = open_arrays(path)
    np.testing.assert_array_equal(arrays["x"], X)
    np.testing.assert_array_equal(arrays["y"], Y)
    assert arrays["x"].dtype == np.float32
    assert not arrays["x"].flags.writeable
    if save is np.savez:  # stored members are mapped from the file, not copied into memory
        assert isinstance(arrays["x"], np.memmap)


def test_a_fortran_ordered_array_reads_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.asfortranarray(X[:, :, :, 0]), y=Y)
    np.testing.assert_array_equal(open_arrays(path)["x"], X[:, :, :, 0])


def test_the_digest_is_the_sha256_of_the_file_bytes(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=X, y=Y)
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    assert file_digest(path) == f"sha256:{expected}"
    changed = X.copy()
    changed[0, 0, 0, 0] += 1
    np.savez(tmp_path / "e.npz", x=changed, y=Y)
    assert file_digest(tmp_path / "e.npz") != file_digest(path)


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ({"x.npy": _npy(np.array([{"a": 1}], dtype=object))}, "not a plain number"),
        ({"x.npy": _npy(np.array(["a", "b"]))}, "not a plain number"),
        ({"x.npy": _npy(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))}, "not a plain number"),
        ({"x.npy": _npy(np.array(3.0, dtype=np.float32))}, "is a scalar"),
        ({"x.npy": _npy(np.zeros((4, 2))), "y.npy": _npy(np.zeros(3))}, "has 3 rows but 'x'"),
        ({"x.npy": _npy(np.zeros((0, 2)))}, "holds no samples"),
        ({}, "holds no arrays"),
        ({"x.npy": _npy(np.zeros(4, dtype=np.float32))[:-8]}, "declares 16 bytes"),
        ({"x.npy": b"not an array"}, "no valid .npy header"),
        ({"dir/x.npy": _npy(np.zeros(1))}, "not a top-level .npy"),
        ({f"a{i}.npy": _npy(np.zeros(1)) for i in range(65)}, "at most 64"),
    ],
)
def test_what_a_dataset_may_not_hold_is_refused_with_the_reason(
    tmp_path: Path, members: dict[str, bytes], reason: str
) -> None:
    path = _zip(tmp_path / "d.npz", members)
    with pytest.raises(DatasetFormatError, match=reason):
        inspect_dataset(path)
    with pytest.raises(DatasetFormatError, match=reason):
        open_arrays(path)


def test_a_file_in_no_known_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.npy"
    np.save(path, X)
    with pytest.raises(DatasetFormatError, match="not a dataset in a known format"):
        inspect_dataset(path)
    with pytest.raises(DatasetFormatError, match="no such file"):
        inspect_dataset(tmp_path / "missing.npz")


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_a_truncated_file_is_refused(tmp_path: Path, save: object) -> None:
    path = tmp_path / "d.npz"
    save(path, x=X, y=Y)  # type: ignore[operator]
    data = path.read_bytes()
    for cut in (len(data) // 2, len(data) - 10):
        path.write_bytes(data[:cut])
        with pytest.raises(DatasetFormatError):
            inspect_dataset(path)


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_flipped_data_byte_fails_the_crc(tmp_path: Path, compression: int) -> None:
    path = tmp_path / "d.npz"
    # Data a deflate stream still decodes after one byte changes: the CRC must catch it.
    _zip(path, {"x.npy": _npy(np.arange(4096, dtype=np.uint8))}, compression)
    data = bytearray(path.read_bytes())
    middle = data.index(b"\x00\x01\x02\x03") + 1000 if compression == zipfile.ZIP_STORED else 200
    data[middle] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetFormatError, match=r"corrupt|not a readable|unreadable|header"):
        inspect_dataset(path)


def test_a_compressed_bomb_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez_compressed(path, x=np.zeros((1_000_000,), dtype=np.float64))
    assert path.stat().st_size < 100_000
    with pytest.raises(DatasetFormatError, match="the limit is 1000000"):
        inspect_dataset(path, max_bytes=1_000_000)
    with pytest.raises(DatasetFormatError, match="the limit is 1000000"):
        open_arrays(path, max_bytes=1_000_000)


def test_a_missing_array_name_lists_the_arrays_there_are(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, images=X, labels=Y)
    info = inspect_dataset(path)
    assert info.array("labels").shape == (5,)
    with pytest.raises(DatasetFormatError, match=r"no array 'x' \(it has: images, labels\)"):
        info.array("x")
    assert info.as_record() == {
        "format": "npz",
        "samples": 5,
        "arrays": {
            "images": {"shape": [5, 8, 8, 1], "dtype": "float32"},
            "labels": {"shape": [5], "dtype": "int64"},
        },
    }
