"""Dataset files: what a job may train on, checked before anything trusts them (NumPy only).

A dataset is a file of named arrays, one row per sample along the first dimension
(`x` of shape `[N, 8, 8, 1]`, `y` of shape `[N]`). Only plain numeric or bool arrays are
accepted: object dtypes would need pickle, and a pickle is code. The API imports this
module to check uploads, so it must not import TensorFlow.

Formats are read by small readers keyed by format name; `.npz` (np.savez or
np.savez_compressed) is the one there is today. Another format (a directory of `.npy`,
TFRecord, Parquet) is a new `_Reader` registered in `_READERS` with a `sniff` test.
"""

from __future__ import annotations

import hashlib
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, BinaryIO, Literal

import numpy as np

from worker.errors import CheckpointError
from worker.record.npz_reader import Member, inspect_npz

MAX_ARRAYS = 64  # named arrays in one dataset
# Bytes the arrays may take once inflated. A stored npz is bounded by its file size; a
# compressed one can declare anything, so without a caller's bound this one applies.
DEFAULT_MAX_ARRAY_BYTES = 16 * 2**30
_CHUNK = 1 << 20  # streaming read size while verifying: memory stays bounded
_ZIP_LOCAL_HEADER = struct.Struct("<4s5H3I2H")  # 30 bytes before a member's name


class DatasetFormatError(ValueError):
    """The file is not a dataset this service accepts; str(exc) is the reason."""


class DatasetTooLarge(DatasetFormatError):
    """The arrays declare more bytes, once inflated, than the caller's bound."""

    def __init__(self, where: str, declared: int, limit: int) -> None:
        super().__init__(
            f"{where}: its arrays take {declared} bytes once inflated; the limit is {limit}"
        )
        self.declared = declared
        self.limit = limit


@dataclass(frozen=True)
class ArrayInfo:
    """One named array of a dataset as stored (shape includes the sample dimension)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # NumPy's name: "float32", "uint8", "bool"
    # Smallest and largest value of an integer array, found while every byte is checked, so
    # token ids and class labels can be checked against a spec before any job reads them.
    low: int | None = None
    high: int | None = None


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset holds: its format, its arrays in file order, and its sample count."""

    format: str
    arrays: tuple[ArrayInfo, ...]
    samples: int

    def array(self, name: str) -> ArrayInfo:
        """The array called `name`; DatasetFormatError naming the arrays there are."""
        for info in self.arrays:
            if info.name == name:
                return info
        known = ", ".join(a.name for a in self.arrays)
        raise DatasetFormatError(f"the dataset has no array {name!r} (it has: {known})")

    def as_record(self) -> dict[str, object]:
        """JSON-ready description for provenance and the API."""
        return {
            "format": self.format,
            "samples": self.samples,
            "arrays": {a.name: {"shape": list(a.shape), "dtype": a.dtype} for a in self.arrays},
        }


@dataclass(frozen=True)
class _Reader:
    sniff: Callable[[Path], bool]
    # (path, max inflated bytes, the file's name in messages): the full check
    inspect: Callable[[Path, int, str], DatasetInfo]
    open: Callable[[Path, int], dict[str, np.ndarray]]
    declared_bytes: Callable[[Path], int]  # the arrays' inflated size, from headers only


def file_digest(path: Path) -> str:
    """`sha256:<hex>` of the file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def inspect_dataset(
    path: Path, *, max_bytes: int = DEFAULT_MAX_ARRAY_BYTES, label: str | None = None
) -> DatasetInfo:
    """The dataset's description after checking every byte of it, with bounded memory.

    DatasetFormatError with the reason if the file is in no known format, is truncated or
    corrupt (CRC), holds a non-numeric array, an array without a sample dimension, arrays
    that disagree on the number of samples; DatasetTooLarge if its arrays declare more
    than `max_bytes` once inflated, found from the headers before anything is inflated.
    Messages name the file `label` (default: the file's name), never its path.
    """
    path = Path(path)
    where = label or path.name
    return _reader(path, where).inspect(path, max_bytes, where)


def declared_bytes(path: Path) -> int:
    """What the dataset's arrays take once inflated, read from their headers alone."""
    path = Path(path)
    return _reader(path, path.name).declared_bytes(path)


def open_arrays(path: Path, *, max_bytes: int = DEFAULT_MAX_ARRAY_BYTES) -> dict[str, np.ndarray]:
    """The dataset's arrays by name, read-only; memory-mapped where stored uncompressed.

    Headers are checked as in `inspect_dataset`, but stored bytes are not re-read: the
    caller has checked the file's digest (a job) or inspected it (the API) already.
    """
    path = Path(path)
    return _reader(path, path.name).open(path, max_bytes)


def _reader(path: Path, where: str) -> _Reader:
    if not path.exists():
        raise DatasetFormatError(f"{where}: no such file")
    for reader in _READERS.values():
        if reader.sniff(path):
            return reader
    raise DatasetFormatError(f"{where}: not a dataset in a known format ({', '.join(_READERS)})")


def _renamed(text: str, path: Path, where: str) -> str:
    # Messages reach API clients: a spooled upload's path means nothing to them.
    return text.replace(str(path), where).replace(path.name, where)


# --- .npz -------------------------------------------------------------------------------


def _npz_sniff(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as fh:
        magic = fh.read(4)
    # A zip starts with a local header, or with its end record when it has no members.
    return magic in (b"PK\x03\x04", b"PK\x05\x06")


def _npz_headers(path: Path, where: str) -> dict[str, Member]:
    try:
        return inspect_npz(
            path,
            max_members=MAX_ARRAYS,
            max_bytes=None,
            compressed_ok=True,
            too_many="a dataset may hold at most",
        )
    except CheckpointError as exc:  # the reader's refusals name the problem already
        raise DatasetFormatError(_renamed(str(exc), path, where)) from None


def _npz_declared_bytes(path: Path) -> int:
    return sum(m.nbytes for m in _npz_headers(path, path.name).values())


def _npz_members(
    path: Path, max_bytes: int, where: str | None = None
) -> tuple[dict[str, Member], DatasetInfo]:
    where = where or path.name
    members = _npz_headers(path, where)
    if not members:
        raise DatasetFormatError(f"{where}: holds no arrays")
    total = sum(m.nbytes for m in members.values())
    if total > max_bytes:
        raise DatasetTooLarge(where, total, max_bytes)
    for m in members.values():
        if not m.shape:
            raise DatasetFormatError(
                f"{where}: array {m.name!r} is a scalar; every array needs one row per sample"
            )
    first = next(iter(members.values()))
    samples = first.shape[0]
    for m in members.values():
        if m.shape[0] != samples:
            raise DatasetFormatError(
                f"{where}: array {m.name!r} has {m.shape[0]} rows but {first.name!r} has "
                f"{samples}; every array needs one row per sample"
            )
    arrays = [ArrayInfo(m.name, m.shape, m.dtype.name) for m in members.values()]
    if samples == 0:
        raise DatasetFormatError(f"{where}: holds no samples")
    return members, DatasetInfo("npz", tuple(arrays), samples)


def _npz_inspect(path: Path, max_bytes: int, where: str) -> DatasetInfo:
    members, info = _npz_members(path, max_bytes, where)
    ranges: dict[str, tuple[int, int]] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for zinfo in zf.infolist():
                member = members.get(zinfo.filename.removesuffix(".npy"))
                # Reading a member to its end checks its CRC; a truncated or altered one fails.
                with zf.open(zinfo) as fh:
                    found = _read_range(fh, zinfo, member)
                if found is not None and member is not None:
                    ranges[member.name] = found
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        reason = _renamed(str(exc), path, where)
        raise DatasetFormatError(f"{where}: corrupt or truncated ({reason})") from None
    arrays = tuple(
        replace(a, low=ranges[a.name][0], high=ranges[a.name][1]) if a.name in ranges else a
        for a in info.arrays
    )
    return replace(info, arrays=arrays)


def _read_range(
    fh: IO[bytes], zinfo: zipfile.ZipInfo, member: Member | None
) -> tuple[int, int] | None:
    """Reads the member to its end; (min, max) of its values when it is a non-empty integer
    array, in chunks of whole items so memory stays bounded."""
    integer = member is not None and member.dtype.kind in "iu" and member.nbytes > 0
    if member is None or not integer:
        while fh.read(_CHUNK):
            pass
        return None
    fh.read(zinfo.file_size - member.nbytes)  # the .npy header
    size = member.dtype.itemsize
    step = max(size, _CHUNK - _CHUNK % size)
    low: int | None = None
    high: int | None = None
    rest = b""
    while chunk := fh.read(step):
        data = rest + chunk
        whole = len(data) - len(data) % size
        rest = data[whole:]
        if whole:
            values = np.frombuffer(data[:whole], dtype=member.dtype)
            lo, hi = int(values.min()), int(values.max())
            low = lo if low is None else min(low, lo)
            high = hi if high is None else max(high, hi)
    return None if low is None or high is None else (low, high)


def _data_offset(fh: BinaryIO, zinfo: zipfile.ZipInfo, header_bytes: int) -> int:
    """Byte offset in the file of a stored member's array data."""
    fh.seek(zinfo.header_offset)
    fixed = fh.read(_ZIP_LOCAL_HEADER.size)
    if len(fixed) != _ZIP_LOCAL_HEADER.size or fixed[:4] != b"PK\x03\x04":
        raise DatasetFormatError(f"member {zinfo.filename!r}: bad local header")
    fields = _ZIP_LOCAL_HEADER.unpack(fixed)
    name_len, extra_len = fields[-2], fields[-1]
    return int(zinfo.header_offset + _ZIP_LOCAL_HEADER.size + name_len + extra_len + header_bytes)


def _npz_open(path: Path, max_bytes: int) -> dict[str, np.ndarray]:
    members, _ = _npz_members(path, max_bytes)
    where = path.name
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as zf, open(path, "rb") as raw:
            for name, m in members.items():
                zinfo = zf.getinfo(f"{name}.npy")
                order: Literal["C", "F"] = "F" if m.fortran_order else "C"
                if m.compressed:
                    with zf.open(zinfo) as fh:
                        array = np.lib.format.read_array(fh, allow_pickle=False)
                    array.setflags(write=False)
                elif m.nbytes == 0:
                    array = np.empty(m.shape, dtype=m.dtype, order=order)
                else:
                    header_bytes = zinfo.file_size - m.nbytes
                    offset = _data_offset(raw, zinfo, header_bytes)
                    array = np.memmap(
                        path, dtype=m.dtype, mode="r", offset=offset, shape=m.shape, order=order
                    )
                if array.shape != m.shape or array.dtype != m.dtype:
                    raise DatasetFormatError(f"{where}: array {name!r} changed while read")
                arrays[name] = array
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, zlib.error) as exc:
        if isinstance(exc, DatasetFormatError):
            raise
        raise DatasetFormatError(f"{where}: unreadable array ({exc})") from None
    return arrays


_READERS: dict[str, _Reader] = {
    "npz": _Reader(_npz_sniff, _npz_inspect, _npz_open, _npz_declared_bytes),
}
