"""Code bundles: a wheel of user components, checked without importing it, installed per job.

The API checks a pushed wheel with `inspect_wheel` (nothing is imported or executed): a
readable zip with bounded member count and sizes and no path tricks, a `*.dist-info`
directory whose RECORD lists every file with its SHA-256 (the per-file manifest that goes
into provenance and comparisons), and entry points only in the project's groups. A job
installs it with `install`: the same checks, then the members unpacked into a private
directory placed first on `sys.path` (installing a pure wheel is unpacking it; no network,
no dependency resolution), and each entry point loaded once so a missing package or an
import that misbehaves fails the job with a clear error before training starts.
TensorFlow-free.
"""

from __future__ import annotations

import base64
import configparser
import csv
import hashlib
import importlib
import io
import re
import stat
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

# The entry-point groups a bundle may declare components in: the kinds of component a spec
# names (worker.models.registry.ENTRY_POINT_GROUPS). A custom layer has no such name: it goes
# in the bundle's architecture, which builds the model with it.
# A script's directory (`repro run train.py`) is a bundle too: its one entry point in the
# scripts group names the file that runs, by its path in the bundle; nothing is imported.
SCRIPT_GROUP = "reprotrain.scripts"
GROUPS = (
    "reprotrain.generators",
    "reprotrain.architectures",
    "reprotrain.losses",
    SCRIPT_GROUP,
)
MAX_MEMBERS = 2000  # files in one wheel
MAX_MEMBER_BYTES = 64 * 1024**2  # one file, inflated
MAX_TOTAL_BYTES = 256 * 1024**2  # every file, inflated
# The metadata files are read before anything else is trusted, so each is bounded before it
# is parsed: METADATA's header block (its description, after the first blank line, is never
# read), RECORD (one row per member) and entry_points.txt.
MAX_METADATA_HEADER_LINES = 1000
MAX_METADATA_HEADER_BYTES = 256 * 1024
MAX_RECORD_BYTES = 4 * 1024**2
MAX_ENTRY_POINTS_BYTES = 256 * 1024
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_ENTRY_VALUE = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$")
_SCRIPT_PATH = re.compile(r"^(?:[\w.-]+/)*[\w.-]+\.py$")


class CodeBundleError(ValueError):
    """The file is not a code bundle this service accepts (the message says why)."""


class BundleImportError(RuntimeError):
    """A bundle's entry point could not be loaded in this environment."""


@dataclass(frozen=True)
class WheelInfo:
    """What a wheel holds, as read from its own metadata."""

    name: str  # the distribution name
    version: str
    files: list[dict[str, Any]] = field(default_factory=list)  # [{"path", "sha256", "size"}]
    entry_points: list[dict[str, str]] = field(default_factory=list)  # [{"group","name","value"}]

    def manifest(self) -> dict[str, str]:
        """path -> sha256 of every file of the bundle."""
        return {f["path"]: f["sha256"] for f in self.files}


def _safe_member(name: str) -> str:
    path = PurePosixPath(name)
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        raise CodeBundleError(f"member {name!r} has an absolute or unusual path")
    if any(part in ("..", "") for part in name.rstrip("/").split("/")) or path.is_absolute():
        raise CodeBundleError(f"member {name!r} leaves the install directory")
    return name


def _check_members(zf: zipfile.ZipFile, *, max_members: int, max_total_bytes: int) -> None:
    infos = zf.infolist()
    if len(infos) > max_members:
        raise CodeBundleError(f"the wheel has {len(infos)} files, more than {max_members}")
    total = 0
    for info in infos:
        _safe_member(info.filename)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise CodeBundleError(f"member {info.filename!r} is a symbolic link")
        if info.file_size > MAX_MEMBER_BYTES:
            raise CodeBundleError(
                f"member {info.filename!r} inflates to {info.file_size} bytes, more than "
                f"{MAX_MEMBER_BYTES}"
            )
        total += info.file_size
    if total > max_total_bytes:
        raise CodeBundleError(
            f"the wheel's files inflate to {total} bytes, more than {max_total_bytes}"
        )


def _dist_info(zf: zipfile.ZipFile) -> str:
    tops = {n.split("/", 1)[0] for n in zf.namelist() if "/" in n}
    found = sorted(t for t in tops if t.endswith(".dist-info"))
    if len(found) != 1:
        raise CodeBundleError(f"a wheel has exactly one *.dist-info directory, found {found}")
    return found[0]


def _read_small(zf: zipfile.ZipFile, name: str, limit: int) -> bytes:
    """A member of at most `limit` bytes (KeyError when absent), refused before it is read."""
    size = zf.getinfo(name).file_size
    if size > limit:
        raise CodeBundleError(f"{name} is {size} bytes, more than the {limit} a bundle may have")
    return zf.read(name)


def _member_sha256(zf: zipfile.ZipFile, path: str) -> tuple[Any, int]:
    """The SHA-256 of a member and its size, read in chunks (a member may be 64 MiB)."""
    digest, size = hashlib.sha256(), 0
    try:
        with zf.open(path) as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except KeyError:
        raise CodeBundleError(f"RECORD lists {path!r}, which the wheel lacks") from None
    return digest, size


def _read_record(zf: zipfile.ZipFile, dist_info: str) -> list[dict[str, Any]]:
    record_name = f"{dist_info}/RECORD"
    try:
        text = _read_small(zf, record_name, MAX_RECORD_BYTES).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        raise CodeBundleError(f"the wheel has no readable {record_name}") from None
    files, listed = [], set()
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        path = _safe_member(row[0])
        if path == record_name or path.endswith("/RECORD.jws") or path.endswith("/RECORD.p7s"):
            continue
        if path in listed:  # each listed file is read and hashed once, not once per row
            raise CodeBundleError(f"RECORD lists {path!r} more than once")
        if len(row) < 3 or not row[1].startswith("sha256="):
            raise CodeBundleError(f"RECORD gives {path!r} no sha256 digest")
        digest, size = _member_sha256(zf, path)
        actual = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
        if actual != row[1].removeprefix("sha256="):
            raise CodeBundleError(f"{path!r} does not match its RECORD digest")
        files.append({"path": path, "sha256": digest.hexdigest(), "size": size})
        listed.add(path)
    unlisted = [
        n for n in zf.namelist() if not n.endswith("/") and n not in listed and n != record_name
    ]
    if unlisted:
        raise CodeBundleError(f"{unlisted[0]!r} is in the wheel but not in its RECORD")
    return sorted(files, key=lambda f: f["path"])


def _entry_points(zf: zipfile.ZipFile, dist_info: str) -> list[dict[str, str]]:
    try:
        name = f"{dist_info}/entry_points.txt"
        text = _read_small(zf, name, MAX_ENTRY_POINTS_BYTES).decode("utf-8")
    except KeyError:
        return []
    except UnicodeDecodeError:
        raise CodeBundleError("entry_points.txt is not UTF-8") from None
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        raise CodeBundleError(f"entry_points.txt is malformed: {exc}") from None
    unknown = [group for group in parser.sections() if group not in GROUPS]
    if unknown:
        raise CodeBundleError(
            f"entry point groups {', '.join(repr(g) for g in unknown)} are not ones a bundle may "
            f"declare ({', '.join(GROUPS)}); console scripts and other plugins are refused, and "
            "a custom layer goes in the bundle's architecture"
        )
    found = []
    for group in parser.sections():
        for name, value in parser.items(group):
            pattern = _SCRIPT_PATH if group == SCRIPT_GROUP else _ENTRY_VALUE
            if not _NAME.match(name) or not pattern.match(value.strip()):
                raise CodeBundleError(f"entry point {group}:{name} = {value!r} is malformed")
            found.append({"group": group, "name": name, "value": value.strip()})
    return found


def _metadata_headers(zf: zipfile.ZipFile, dist_info: str) -> list[str]:
    """The header lines of METADATA, read line by line up to the blank line that ends them,
    within MAX_METADATA_HEADER_LINES and MAX_METADATA_HEADER_BYTES."""
    try:
        fh = zf.open(f"{dist_info}/METADATA")
    except KeyError:
        raise CodeBundleError(f"the wheel has no {dist_info}/METADATA") from None
    lines: list[str] = []
    read = 0
    with fh:
        while line := fh.readline(MAX_METADATA_HEADER_BYTES - read + 1):
            read += len(line)
            if read > MAX_METADATA_HEADER_BYTES or len(lines) >= MAX_METADATA_HEADER_LINES:
                raise CodeBundleError(
                    f"METADATA's headers run past {MAX_METADATA_HEADER_LINES} lines or "
                    f"{MAX_METADATA_HEADER_BYTES} bytes: not a bundle's metadata"
                )
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            if not text:
                break
            lines.append(text)
    return lines


def _metadata(zf: zipfile.ZipFile, dist_info: str) -> tuple[str, str]:
    headers = _metadata_headers(zf, dist_info)
    fields = dict(line.split(": ", 1) for line in headers if ": " in line)
    name, version = fields.get("Name", "").strip(), fields.get("Version", "").strip()
    if not _NAME.match(name) or not _NAME.match(version):
        raise CodeBundleError("the wheel's METADATA has no usable Name and Version")
    return name, version


def inspect_wheel(
    path: Path,
    *,
    max_members: int = MAX_MEMBERS,
    max_total_bytes: int = MAX_TOTAL_BYTES,
) -> WheelInfo:
    """What the wheel at `path` holds; CodeBundleError with the reason when it is not a
    bundle this service accepts. Nothing in it is imported or executed."""
    try:
        with zipfile.ZipFile(path) as zf:
            _check_members(zf, max_members=max_members, max_total_bytes=max_total_bytes)
            dist_info = _dist_info(zf)
            name, version = _metadata(zf, dist_info)
            files = _read_record(zf, dist_info)
            entry_points = _entry_points(zf, dist_info)
            paths = {f["path"] for f in files}
            for ep in entry_points:
                if ep["group"] == SCRIPT_GROUP and ep["value"] not in paths:
                    raise CodeBundleError(f"its script {ep['value']!r} is not among its files")
    except zipfile.BadZipFile as exc:
        raise CodeBundleError(f"not a wheel (zip): {exc}") from None
    except (OSError, EOFError, zipfile.LargeZipFile, NotImplementedError) as exc:
        raise CodeBundleError(f"the wheel cannot be read: {exc}") from None
    if not entry_points:
        raise CodeBundleError(
            f"the wheel declares no entry point in {', '.join(GROUPS)}: nothing to use"
        )
    return WheelInfo(name=name, version=version, files=files, entry_points=entry_points)


def file_sha256(path: Path) -> str:
    """`sha256:<hex>` of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def install(wheel: Path, directory: Path, *, digest: str) -> WheelInfo:
    """Check the wheel is `digest` and a valid bundle, unpack it into `directory` and put that
    first on `sys.path` for this process; CodeBundleError otherwise."""
    actual = file_sha256(wheel)
    if actual != digest:
        raise CodeBundleError(f"{wheel.name} has digest {actual}, not the spec's {digest}")
    info = inspect_wheel(wheel)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        for member in info.files:
            target = directory / member["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(member["path"]))
    sys.path.insert(0, str(directory))
    importlib.invalidate_caches()
    return info


def load_entry_points(info: WheelInfo, *, digest: str) -> None:
    """Import each of the bundle's entry points once; BundleImportError naming the entry
    point and the missing module (or what else went wrong) when one cannot be loaded."""
    for ep in info.entry_points:
        if ep["group"] == SCRIPT_GROUP:
            continue  # a script runs in a process of its own
        module, _, attr = ep["value"].partition(":")
        where = f"entry point {ep['group']}:{ep['name']} ({ep['value']}) of code bundle {digest}"
        try:
            obj: Any = importlib.import_module(module)
            for part in filter(None, attr.split(".")):
                obj = getattr(obj, part)
        except ModuleNotFoundError as exc:
            raise BundleImportError(
                f"{where} imports {exc.name!r}, which this worker image lacks: build a derived "
                "image with it (docker/build.sh user --requirements FILE) and pin that image"
            ) from exc
        except Exception as exc:
            raise BundleImportError(
                f"{where} failed at import: {type(exc).__name__}: {exc}"
            ) from exc
