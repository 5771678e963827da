"""Progress lines a job writes on stderr, and their parsing by the parent process.

Each event is one line: `@repro ` followed by a JSON object with an "event" field.
Everything else on stderr (TensorFlow's own logging) is left for humans.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

PREFIX = "@repro "


def format_event(event: str, **fields: Any) -> str:
    """One progress line (without the newline)."""
    return PREFIX + json.dumps({"event": event, **fields}, separators=(",", ":"))


def parse_line(line: str) -> dict[str, Any] | None:
    """The event of a progress line, or None for any other line."""
    if not line.startswith(PREFIX):
        return None
    try:
        event = json.loads(line[len(PREFIX) :])
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


class ProgressReporter:
    """Writes progress events; step events at most every `interval` seconds."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = 0.5) -> None:
        self.stream = stream or sys.stderr
        self.interval = interval
        self._last_step = 0.0

    def emit(self, event: str, **fields: Any) -> None:
        """Write one event now."""
        self.stream.write(format_event(event, **fields) + "\n")
        self.stream.flush()

    def step_due(self) -> bool:
        """Whether a step event would be written now (lets callers skip reading the loss)."""
        return time.monotonic() - self._last_step >= self.interval

    def step(self, **fields: Any) -> None:
        """Write a step event; the caller checks `step_due()` first."""
        self._last_step = time.monotonic()
        self.emit("step", **fields)
