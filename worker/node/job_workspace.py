"""A job's workspace as the agent reads it: never through a link, never outside it.

A job can write anything in its workspace (under the docker executor it is a read-write
bind mount of the host's attempt directory), so a symbolic link named like a checkpoint
would make the agent upload whatever host file it points at. The agent therefore holds the
attempt directory open from before the job starts and reaches every file the job wrote one
path component at a time relative to that descriptor, each with O_NOFOLLOW (directories
with O_DIRECTORY too); it takes only regular files (fstat of the opened descriptor, not of
a path), within a size bound, and hashes, reads and uploads from that same descriptor. A
name swapped for a link after the open changes nothing the agent reads.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import IO, Self

_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO a job planted returns at once (and is then refused) instead of
# waiting for a writer; it changes nothing for a regular file.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeJobFile(ValueError):
    """A file of the job's workspace the agent will not read: a link, not a regular file,
    outside the workspace, or larger than the bound."""


class FileTooLarge(UnsafeJobFile):
    """A regular file larger than the bound the agent reads it by."""

    def __init__(self, what: str, size: int, max_bytes: int) -> None:
        super().__init__(f"{what} holds {size} bytes, more than the {max_bytes} allowed")
        self.size, self.max_bytes = size, max_bytes


class OpenedFile:
    """A regular file, open; its size is the size it had when opened, and every read goes
    through this descriptor (from the start each time, so a retried upload resends it)."""

    def __init__(self, fd: int, name: str, size: int) -> None:
        self.fd = fd
        self.name = name
        self.size = size

    def chunks(self) -> Iterator[bytes]:
        """The file's first `size` bytes, in 1 MiB blocks."""
        offset = 0
        while offset < self.size:
            block = os.pread(self.fd, min(_CHUNK, self.size - offset), offset)
            if not block:  # truncated since it was opened: the receiver's digest check fails
                return
            offset += len(block)
            yield block

    def read(self) -> bytes:
        """The whole file (it was opened within its bound)."""
        return b"".join(self.chunks())

    def sha256(self) -> str:
        """Hex SHA-256 of what `chunks()` yields."""
        digest = hashlib.sha256()
        for block in self.chunks():
            digest.update(block)
        return digest.hexdigest()

    def close(self) -> None:
        """Close the descriptor (once)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _is_link(name: str, dir_fd: int) -> bool:
    with contextlib.suppress(OSError):
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    return False


def _refusal(what: str, exc: OSError, *, link: bool = False) -> UnsafeJobFile | OSError:
    """What an O_NOFOLLOW open's failure means to a user (`link`: the name is a link)."""
    if link or exc.errno in (errno.ELOOP, errno.EMLINK):
        return UnsafeJobFile(
            f"{what} is a symbolic link: the agent reads only regular files a job wrote in "
            "its workspace, never through a link"
        )
    if exc.errno == errno.ENOTDIR:
        return UnsafeJobFile(f"{what}: a component of the path is not a directory")
    return exc


def _regular(fd: int, what: str, max_bytes: int | None) -> OpenedFile:
    """The opened `fd` as an OpenedFile if it is a regular file within `max_bytes`; else
    UnsafeJobFile (and `fd` closed)."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeJobFile(f"{what} is not a regular file; the agent does not read it")
        if max_bytes is not None and info.st_size > max_bytes:
            raise FileTooLarge(what, info.st_size, max_bytes)
    except BaseException:
        os.close(fd)
        raise
    return OpenedFile(fd, what, info.st_size)


def open_regular(path: Path, *, max_bytes: int | None = None) -> OpenedFile:
    """Open `path` for reading if it is a regular file and not a link (the last component;
    for the agent's own directories, whose parents no job can change)."""
    try:
        fd = os.open(path, _FILE_FLAGS)
    except OSError as exc:
        raise _refusal(str(path), exc) from None
    return _regular(fd, str(path), max_bytes)


class JobWorkspace:
    """A job's attempt directory, held open by descriptor for as long as the run lasts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, _DIR_FLAGS)

    def close(self) -> None:
        """Close the directory's descriptor (once)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _parts(self, relative: Path | str) -> list[str]:
        """The components of `relative` (a path inside the workspace, or an absolute path
        under it); UnsafeJobFile for one that would leave it."""
        path = PurePosixPath(relative)
        if path.is_absolute():
            try:
                path = path.relative_to(self.path)
            except ValueError:
                raise UnsafeJobFile(f"{relative} is not in the job's workspace") from None
        parts = list(path.parts)
        if not parts or any(part in ("", ".", "..") for part in parts):
            raise UnsafeJobFile(f"{relative!s} is not a file name in the job's workspace")
        return parts

    @contextlib.contextmanager
    def _parent(self, parts: list[str]) -> Iterator[int]:
        """The descriptor of the directory holding `parts[-1]`, each directory on the way
        opened relative to the one before without following a link."""
        fd = self._fd
        try:
            for depth, part in enumerate(parts[:-1], start=1):
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    # A link to a directory fails O_DIRECTORY|O_NOFOLLOW with ENOTDIR.
                    link = exc.errno == errno.ENOTDIR and _is_link(part, fd)
                    raise _refusal("/".join(parts[:depth]), exc, link=link) from None
                if fd != self._fd:
                    os.close(fd)
                fd = child
            yield fd
        finally:
            if fd != self._fd:
                os.close(fd)

    def open_file(self, relative: Path | str, *, max_bytes: int | None) -> OpenedFile:
        """Open a file the job wrote; UnsafeJobFile unless it is a regular file in the
        workspace, reached through no link, of at most `max_bytes` (None: any size)."""
        parts = self._parts(relative)
        what = "/".join(parts)
        with self._parent(parts) as parent:
            try:
                fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=parent)
            except OSError as exc:
                raise _refusal(what, exc) from None
        return _regular(fd, what, max_bytes)

    def read_bytes(self, relative: Path | str, *, max_bytes: int) -> bytes:
        """The whole of a file the job wrote, read as `open_file` opens it."""
        with self.open_file(relative, max_bytes=max_bytes) as opened:
            return opened.read()

    def create_log(self, name: str, *, replace: bool = False) -> IO[str]:
        """A new text file for the agent to write in the workspace (before the job starts:
        O_EXCL and O_NOFOLLOW, so nothing a job placed there is written through); with
        `replace`, whatever has the name is unlinked first (a link goes, not its target)."""
        leaf = self._parts(name)[-1]
        if replace:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leaf, dir_fd=self._fd)
        fd = os.open(leaf, _LOG_FLAGS, 0o644, dir_fd=self._fd)
        return os.fdopen(fd, "w", encoding="utf-8")

    def move_out(self, relative: Path | str, directory: Path) -> Path | None:
        """Move a regular file the job wrote into `directory` (the agent's own) under its
        own name, by rename relative to the descriptors; None if there is no such file."""
        parts = self._parts(relative)
        what = "/".join(parts)
        with self._parent(parts) as parent:
            try:
                info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise _refusal(what, exc) from None
            if not stat.S_ISREG(info.st_mode):  # a link included: lstat does not follow it
                raise UnsafeJobFile(f"{what} is not a regular file; the agent does not keep it")
            target = directory / parts[-1]
            # A rename moves the name, never what a link points at; the courier opens the
            # moved file with O_NOFOLLOW and takes it only if it is still a regular file.
            os.rename(parts[-1], target, src_dir_fd=parent)
        return target
