"""The agent reads what a job wrote only as regular files inside its workspace: never through
a symbolic link (of the file or of a directory on the way), never a FIFO, never past a size
bound; and a job that swaps a file or a directory for a link while the agent opens it gets
nothing of what the link points at."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from worker.node.job_workspace import JobWorkspace, UnsafeJobFile, open_regular

SECRET = b"the agent's secret, outside the workspace"
CHECKPOINT = "checkpoints/step-000000001.npz"
ROUNDS = 3000
RACE_SECONDS = 30.0


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace with a regular checkpoint, and a host directory holding a secret of the
    same name beside it."""
    workspace, host = tmp_path / "attempt-1", tmp_path / "host"
    (workspace / "checkpoints").mkdir(parents=True)
    (workspace / CHECKPOINT).write_bytes(b"job bytes")
    host.mkdir()
    (host / "step-000000001.npz").write_bytes(SECRET)
    return workspace, host


def test_links_and_other_non_regular_files_are_refused(layout: tuple[Path, Path]) -> None:
    workspace, host = layout
    (workspace / "result.json").symlink_to(host / "step-000000001.npz")
    (workspace / "linked").symlink_to(host, target_is_directory=True)
    os.mkfifo(workspace / "fifo")  # opening it must not wait for a writer
    with JobWorkspace(workspace) as files:
        with files.open_file(CHECKPOINT, max_bytes=100) as opened:
            assert opened.read() == b"job bytes"
        for name, reason in [
            ("result.json", "is a symbolic link"),
            ("linked/step-000000001.npz", "linked is a symbolic link"),
            ("fifo", "not a regular file"),
            ("../host/step-000000001.npz", "not a file name in the job's workspace"),
            (host / "step-000000001.npz", "not in the job's workspace"),
        ]:
            with pytest.raises(UnsafeJobFile, match=reason):
                files.open_file(name, max_bytes=None)
        with pytest.raises(UnsafeJobFile, match="holds 9 bytes, more than the 8 allowed"):
            files.open_file(CHECKPOINT, max_bytes=8)
        with pytest.raises(UnsafeJobFile, match="is not a regular file"):
            files.move_out("result.json", host)  # moving the link would upload its target
        assert (workspace / "result.json").is_symlink()
    with pytest.raises(UnsafeJobFile, match="is a symbolic link"):
        open_regular(workspace / "result.json")


def test_the_agent_s_log_is_never_written_through_a_link(layout: tuple[Path, Path]) -> None:
    workspace, host = layout
    (workspace / "job.log").symlink_to(host / "step-000000001.npz")
    with JobWorkspace(workspace) as files, pytest.raises(FileExistsError):
        files.create_log("job.log")
    assert (host / "step-000000001.npz").read_bytes() == SECRET


def _swap_file(workspace: Path, host: Path) -> Iterator[None]:
    """Replace the checkpoint by a link to the secret and back, each an atomic rename."""
    regular, link = workspace / "checkpoints/.regular", workspace / "checkpoints/.link"
    while True:
        regular.write_bytes(b"job bytes")
        os.replace(regular, workspace / CHECKPOINT)
        yield
        link.symlink_to(host / "step-000000001.npz")
        os.replace(link, workspace / CHECKPOINT)
        yield


def _swap_directory(workspace: Path, host: Path) -> Iterator[None]:
    """Replace the checkpoint directory by a link to the host directory and back."""
    real, link = workspace / ".checkpoints", workspace / ".link"
    if (workspace / "checkpoints").is_symlink():  # an earlier race stopped mid-swap
        os.rename(workspace / "checkpoints", link)
        os.rename(real, workspace / "checkpoints")
    if not link.is_symlink():
        link.symlink_to(host, target_is_directory=True)
    while True:
        os.rename(workspace / "checkpoints", real)
        os.rename(link, workspace / "checkpoints")
        yield
        os.rename(workspace / "checkpoints", link)
        os.rename(real, workspace / "checkpoints")
        yield


def _race(
    swaps: Iterator[None], read: Callable[[], bytes | None], *, until: bytes
) -> set[bytes | None]:
    """What `read` returned while another thread kept swapping; None for a refusal.

    At least ROUNDS reads, and on a loaded machine (where the swapping thread gets few
    turns) more, until `read` has returned `until` once or RACE_SECONDS have passed."""
    stop = threading.Event()

    def swapper() -> None:
        while not stop.is_set():
            next(swaps)

    thread = threading.Thread(target=swapper)
    thread.start()
    seen: set[bytes | None] = set()
    try:
        deadline = time.monotonic() + RACE_SECONDS
        rounds = 0
        while rounds < ROUNDS or (until not in seen and time.monotonic() < deadline):
            rounds += 1
            try:
                seen.add(read())
            except (UnsafeJobFile, FileNotFoundError):
                seen.add(None)
    finally:
        stop.set()
        thread.join()
    return seen


@pytest.mark.parametrize("swap", [_swap_file, _swap_directory], ids=["file", "directory"])
def test_a_swap_between_check_and_open_yields_nothing_of_the_link_s_target(
    layout: tuple[Path, Path], swap: Callable[[Path, Path], Iterator[None]]
) -> None:
    workspace, host = layout

    def checked_then_opened() -> bytes | None:
        # What a reader that checks before it opens sees: the swap lands in between.
        path = workspace / CHECKPOINT
        if path.is_symlink() or not path.is_file():
            return None
        return path.read_bytes()

    # The race is real: a check followed by an open by name reads the secret.
    assert SECRET in _race(swap(workspace, host), checked_then_opened, until=SECRET)

    with JobWorkspace(workspace) as files:

        def safe() -> bytes:
            with files.open_file(CHECKPOINT, max_bytes=1024) as opened:
                return opened.read()

        seen = _race(swap(workspace, host), safe, until=b"job bytes")
    assert SECRET not in seen
    assert b"job bytes" in seen  # the agent still reads the job's own file
