"""A job's files and output seen from the agent, whatever executor ran it.

Pure helpers, no API calls: which checkpoint files to upload or may be downloaded, a
bounded tail of the job's stderr, and a readable description of how it exited.
"""

from __future__ import annotations

import collections
import re
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

KILL_GRACE_SECONDS = 10.0
# Epoch-end checkpoints, and mid-epoch ones every K global steps.
_CHECKPOINT_FILE = re.compile(r"^(?:epoch-(\d{6})|step-(\d{9}))\.(npz|json)$")

# (epoch, npz, json): the epoch of an epoch-end checkpoint, None for a step checkpoint.
Upload = tuple[int | None, Path, Path]


def checkpoint_uploads(directory: Path, event: dict[str, Any]) -> Upload:
    """The epoch (None: a step checkpoint), npz and json of a "checkpoint" progress event,
    in the order they are uploaded in."""
    name = str(event.get("path", ""))
    match = _CHECKPOINT_FILE.match(name)
    epoch, step = (None, None) if match is None else match.group(1, 2)
    if (
        match is None
        or match.group(3) != "json"
        or (epoch is not None and int(epoch) != event.get("epoch"))
        or (step is not None and int(step) != event.get("step"))
    ):
        raise ValueError(f"not a checkpoint event of this runtime: {event!r}")
    json_path = directory / name
    return (None if epoch is None else int(epoch)), json_path.with_suffix(".npz"), json_path


def checkpoint_downloads(files: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The offered checkpoint files, npz first and json last; ValueError for anything else.

    The json is fetched last so an interrupted download leaves a checkpoint the job ignores;
    names are checked so the server cannot make the agent write outside the checkpoint dir.
    """
    by_kind: dict[str, dict[str, Any]] = {}
    for entry in files:
        match = _CHECKPOINT_FILE.match(str(entry.get("name", "")))
        if match is None or match.group(3) in by_kind:
            raise ValueError(f"unexpected checkpoint file {entry.get('name')!r}")
        by_kind[match.group(3)] = entry
    if set(by_kind) != {"npz", "json"} or (
        Path(by_kind["npz"]["name"]).stem != Path(by_kind["json"]["name"]).stem
    ):
        raise ValueError(f"a checkpoint is one npz and its json, got {list(files)!r}")
    return [by_kind["npz"], by_kind["json"]]


class StderrTail:
    """The last `lines` non-progress stderr lines of a job, each cut to `width` characters."""

    def __init__(self, lines: int = 200, width: int = 2000) -> None:
        self.width = width
        self._lines: collections.deque[str] = collections.deque(maxlen=lines)

    def add(self, line: str) -> None:
        """Remember one line (the oldest falls out when full)."""
        self._lines.append(line if len(line) <= self.width else line[: self.width] + "…")

    def text(self) -> str:
        """The remembered lines, oldest first."""
        return "\n".join(self._lines)


def describe_exit(code: int) -> str:
    """A human reading of a Popen return code ("exit code 1", "signal SIGKILL")."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


# What the agent reads of a job's files at most when the claim does not say: the API's
# default REPRO_MAX_RESULT_BYTES (a larger result would be refused there anyway).
MAX_RESULT_BYTES = 64 * 1024**2


class JobFileBounds(NamedTuple):
    """Bytes the agent reads of one job file: the result document, and one uploaded file
    (None: the API's own bound, which it applies before reading past it)."""

    result: int
    artifact: int | None


def job_file_bounds(limits: dict[str, Any]) -> JobFileBounds:
    """The bounds a claim's `limits` set (`max_result_bytes`, `max_artifact_bytes`), else
    the defaults."""
    result, artifact = limits.get("max_result_bytes"), limits.get("max_artifact_bytes")
    return JobFileBounds(
        result=int(result) if isinstance(result, int) and result > 0 else MAX_RESULT_BYTES,
        artifact=int(artifact) if isinstance(artifact, int) and artifact > 0 else None,
    )


class LogBuffer:
    """The job's log lines not yet taken by the API, for the heartbeats to carry a piece at a
    time. Bounded: while the API does not answer, the oldest pending lines go and a line
    says how much. `offset` counts the bytes of the log the API has taken."""

    def __init__(self, max_pending: int = 1024**2, piece_chars: int = 64 * 1024) -> None:
        self.offset = 0
        self._max_pending, self._piece_chars = max_pending, piece_chars
        self._lines: collections.deque[str] = collections.deque()
        self._pending = 0  # bytes in _lines
        self._dropped = 0
        self._lock = threading.Lock()
        self.refused = False  # the API does not take logs (an older server): none is kept

    def refuse(self) -> None:
        """Send no more: what is pending goes, and what comes is not kept."""
        with self._lock:
            self.refused = True
            self._lines.clear()
            self._pending = self._dropped = 0

    def add(self, line: str) -> None:
        """One line of the job's output (without its newline)."""
        if self.refused:
            return
        text = line[: self._piece_chars - 1] + "\n"
        with self._lock:
            self._lines.append(text)
            self._pending += len(text.encode("utf-8"))
            while self._pending > self._max_pending and len(self._lines) > 1:
                gone = len(self._lines.popleft().encode("utf-8"))
                self._pending -= gone
                self._dropped += gone

    def take(self) -> tuple[int, str] | None:
        """The next piece to send (offset, text), whole lines; None when nothing is pending.
        It stays pending until `taken` is called with it."""
        with self._lock:
            if self._dropped:
                note = f"[{self._dropped} bytes of log dropped while the API did not answer]\n"
                self._lines.appendleft(note)
                self._pending += len(note.encode("utf-8"))
                self._dropped = 0
            parts: list[str] = []
            size = 0
            for line in self._lines:
                if parts and size + len(line) > self._piece_chars:
                    break
                parts.append(line)
                size += len(line)
            return (self.offset, "".join(parts)) if parts else None

    def taken(self, piece: tuple[int, str]) -> None:
        """The API has `piece`: drop its lines (nothing, if another sender took it first)."""
        offset, text = piece
        with self._lock:
            if offset != self.offset:
                return
            left = text
            while left and self._lines and left.startswith(self._lines[0]):
                line = self._lines.popleft()
                self._pending -= len(line.encode("utf-8"))
                left = left[len(line) :]
            self.offset += len(text.encode("utf-8"))
