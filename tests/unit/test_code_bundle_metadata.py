"""A wheel's metadata is bounded before it is parsed: a 100 KB wheel whose METADATA inflates
to 60 MiB of header lines once cost the API 668 MiB of memory per push."""

from __future__ import annotations

import io
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from tests.code_wheels import make_wheel
from worker.models.code_bundles import (
    MAX_METADATA_HEADER_LINES,
    MAX_RECORD_BYTES,
    CodeBundleError,
    inspect_wheel,
)

FILES = {"ring_bundle/__init__.py": b"", "ring_bundle/data.py": b"x = 1\n"}


def deflated(wheel: bytes) -> bytes:
    """The same wheel with its members compressed, as a bomb would be sent."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(wheel)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()


def peak_bytes_of_inspecting(path: Path) -> tuple[int, Exception | None]:
    tracemalloc.start()
    try:
        inspect_wheel(path)
        failure = None
    except CodeBundleError as exc:
        failure = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, failure


def test_sixty_mib_of_header_lines_is_refused_without_reading_them(tmp_path: Path) -> None:
    headers = b"X-Filler: " + b"a" * 50 + b"\n"
    wheel = deflated(make_wheel(FILES, metadata_headers=headers * (60 * 1024**2 // len(headers))))
    assert len(wheel) < 1024**2  # the bomb is small on the wire
    path = tmp_path / "bomb.whl"
    path.write_bytes(wheel)
    peak, failure = peak_bytes_of_inspecting(path)
    assert isinstance(failure, CodeBundleError) and "METADATA's headers run past" in str(failure)
    assert peak < 8 * 1024**2, f"inspecting the bomb held {peak / 1024**2:.0f} MiB"


def test_a_long_description_is_never_read(tmp_path: Path) -> None:
    # A real package's README body sits after the headers' blank line: not parsed, not held.
    body = b"\n" + b"A long README line.\n" * (2 * 1024**2)
    path = tmp_path / "ok.whl"
    path.write_bytes(deflated(make_wheel(FILES, metadata_headers=body)))
    peak, failure = peak_bytes_of_inspecting(path)
    assert failure is None
    assert peak < 8 * 1024**2


def test_header_line_count_is_bounded_at_its_limit(tmp_path: Path) -> None:
    def wheel_with(lines: int) -> Path:
        path = tmp_path / f"w{lines}.whl"
        path.write_bytes(make_wheel(FILES, metadata_headers=b"Classifier: x\n" * lines))
        return path

    inspect_wheel(wheel_with(MAX_METADATA_HEADER_LINES - 3))  # + the three make_wheel writes
    with pytest.raises(CodeBundleError, match="run past 1000 lines"):
        inspect_wheel(wheel_with(MAX_METADATA_HEADER_LINES - 2))


def test_record_is_bounded_and_lists_each_file_once(tmp_path: Path) -> None:
    path = tmp_path / "dup.whl"
    wheel = make_wheel(FILES)
    with zipfile.ZipFile(io.BytesIO(wheel)) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    record = next(name for name in members if name.endswith("/RECORD"))
    row = members[record].splitlines()[1] + b"\n"  # ring_bundle/data.py's row
    for extra, reason in ((row, "more than once"), (row * (MAX_RECORD_BYTES // len(row)), "bytes")):
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as zf:
            for name, data in members.items():
                zf.writestr(name, data + extra if name == record else data)
        path.write_bytes(out.getvalue())
        with pytest.raises(CodeBundleError, match=reason):
            inspect_wheel(path)
