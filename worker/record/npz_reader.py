"""Reading `.npz` checkpoints someone else wrote, without trusting them.

An npz is a zip of `.npy` members. Before any array is inflated, the zip's central
directory and each member's `.npy` header (shape, dtype) are read and checked: members
must be plain numeric arrays (no object dtype, no pickle, no structured types), each
member's size in the zip must be exactly what its header declares, and the total must
stay within the caller's bound. Only then are the members the caller asks for read, one
at a time. A 60 KB upload therefore cannot make its reader allocate gigabytes.
"""

from __future__ import annotations

import math
import struct
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from worker.errors import CheckpointError, CheckpointRefused

# Plain numeric kinds: bool, signed and unsigned integers, floats, complex.
_NUMERIC_KINDS = frozenset("biufc")
# `.npy` headers are a few hundred bytes; NumPy's own reader refuses more than this.
_MAX_HEADER_BYTES = 10_000
_END_RECORD = 22  # bytes of a zip's end-of-central-directory record
# A directory entry of an npz member: 46 fixed bytes, a short name, zip64 extras.
_MAX_DIRECTORY_ENTRY = 1024


@dataclass(frozen=True)
class Member:
    """One array of an npz as its header declares it (nothing inflated yet)."""

    name: str  # without `.npy`
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    nbytes: int
    compressed: bool = False


def _header(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo
) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran order, dtype, header length) of a member, reading its header only."""
    with zf.open(info) as fh:
        version = npy_format.read_magic(fh)
        if version == (1, 0):
            parsed = npy_format.read_array_header_1_0(fh, max_header_size=_MAX_HEADER_BYTES)
        elif version in ((2, 0), (3, 0)):
            parsed = npy_format.read_array_header_2_0(fh, max_header_size=_MAX_HEADER_BYTES)
        else:
            raise ValueError(f"unknown .npy format version {version}")
        return (*parsed, fh.tell())


def _member(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str, *, compressed_ok: bool = False
) -> Member:
    name = info.filename
    if not name.endswith(".npy") or "/" in name:
        raise CheckpointRefused(f"{where}: member {name!r} is not a top-level .npy array")
    compressed = info.compress_type != zipfile.ZIP_STORED
    if compressed and compressed_ok and info.compress_type != zipfile.ZIP_DEFLATED:
        raise CheckpointRefused(f"{where}: member {name!r} uses an unsupported compression")
    if not compressed_ok and (compressed or info.compress_size != info.file_size):
        # The job writes checkpoints with np.savez (stored, never compressed); a compressed
        # member can declare any inflated size, so it is not read at all.
        raise CheckpointRefused(f"{where}: member {name!r} is compressed; checkpoints are stored")
    try:
        shape, fortran_order, dtype, header_bytes = _header(zf, info)
    except (ValueError, OSError, EOFError, SyntaxError, zipfile.BadZipFile, zlib.error) as exc:
        raise CheckpointRefused(
            f"{where}: member {name!r} has no valid .npy header ({exc})"
        ) from exc
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in _NUMERIC_KINDS:
        raise CheckpointRefused(f"{where}: member {name!r} has dtype {dtype}, not a plain number")
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise CheckpointRefused(f"{where}: member {name!r} declares shape {shape}")
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    # What np.save writes: the header, then exactly the array's bytes.
    if info.file_size != header_bytes + nbytes:
        raise CheckpointRefused(
            f"{where}: member {name!r} declares {nbytes} bytes of data but holds "
            f"{info.file_size} bytes"
        )
    return Member(
        name[: -len(".npy")], dtype, tuple(shape), bool(fortran_order), nbytes, compressed
    )


def _check_directory(path: Path, max_members: int, too_many: str) -> None:
    """Refuse a zip whose central directory lists more members than allowed, or is larger
    than such a directory can be, before `zipfile` parses it (it builds an object per entry)."""
    where = Path(path).name
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        tail_len = min(size, _END_RECORD + 0xFFFF)  # the end record, then a comment
        fh.seek(size - tail_len)
        tail = fh.read(tail_len)
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < _END_RECORD:
            raise CheckpointRefused(f"{where}: not a zip file (no end of central directory)")
        entries, directory_bytes = struct.unpack("<HI", tail[at + 10 : at + 16])
        if entries == 0xFFFF or directory_bytes == 0xFFFFFFFF:  # zip64: the real counts
            locator = tail.rfind(b"PK\x06\x07", 0, at)
            if locator < 0:
                raise CheckpointRefused(f"{where}: zip64 end record not found")
            (offset,) = struct.unpack("<Q", tail[locator + 8 : locator + 16])
            fh.seek(offset)
            record = fh.read(56)
            if len(record) < 56 or record[:4] != b"PK\x06\x06":
                raise CheckpointRefused(f"{where}: zip64 end record not found")
            entries, directory_bytes = struct.unpack("<QQ", record[32:48])
    if entries > max_members:
        raise CheckpointRefused(f"{where}: {entries} arrays where {too_many} {max_members}")
    if directory_bytes > (max_members + 1) * _MAX_DIRECTORY_ENTRY:
        raise CheckpointRefused(f"{where}: a {directory_bytes}-byte zip directory")


def inspect_npz(
    path: Path,
    *,
    max_members: int,
    max_bytes: int | None,
    compressed_ok: bool = False,
    too_many: str = "the model has",
) -> dict[str, Member]:
    """Every member of the npz as declared, checked, in zip order; nothing is inflated.

    CheckpointRefused if the file is not a zip, has more than `max_members` members, a
    member that is not a plain numeric `.npy` of exactly its declared size, or members
    declaring more than `max_bytes` in total (None: no total bound). Deflated members are
    refused unless `compressed_ok` (datasets may be written with np.savez_compressed); the
    zip's declared inflated size and CRC still bound and check what reading them yields.
    """
    where = Path(path).name
    try:
        size = Path(path).stat().st_size
    except OSError as exc:  # gone or unreadable: not the file's fault, nothing refused
        raise CheckpointError(f"{where}: cannot be read ({exc})") from exc
    try:
        _check_directory(path, max_members, too_many)
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > max_members:
                raise CheckpointRefused(
                    f"{where}: {len(infos)} arrays where {too_many} {max_members}"
                )
            members: dict[str, Member] = {}
            total = 0
            for info in infos:
                member = _member(zf, info, where, compressed_ok=compressed_ok)
                if member.name in members:
                    raise CheckpointRefused(f"{where}: member {member.name!r} appears twice")
                total += member.nbytes
                if max_bytes is not None and total > max_bytes:
                    raise CheckpointRefused(
                        f"{where}: its arrays declare more than {max_bytes} bytes, the limit "
                        "for a checkpoint on this server (REPRO_MAX_CHECKPOINT_BYTES)"
                    )
                members[member.name] = member
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as exc:
        raise CheckpointRefused(f"{where}: not a readable npz ({exc})") from exc
    # Stored members hold their bytes in the file; deflated ones are bounded by max_bytes.
    if sum(m.nbytes for m in members.values() if not m.compressed) > size:
        raise CheckpointRefused(f"{where}: its arrays declare more bytes than the file holds")
    return members


def iter_arrays(
    path: Path, members: dict[str, Member], names: Sequence[str]
) -> Iterator[tuple[str, np.ndarray]]:
    """(name, array) for each named, already inspected member, read one at a time."""
    where = Path(path).name
    try:
        with zipfile.ZipFile(path) as zf:
            for name in names:
                member = members[name]
                with zf.open(f"{name}.npy") as fh:
                    array = npy_format.read_array(fh, allow_pickle=False)
                if array.dtype != member.dtype or array.shape != member.shape:
                    raise CheckpointRefused(f"{where}: member {name!r} changed while read")
                yield name, array
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise CheckpointRefused(f"{where}: unreadable array ({exc})") from exc
