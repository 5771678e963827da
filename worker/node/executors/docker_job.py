"""One job in one container: its stderr, its exit, its deadline, its removal.

The docker SDK has traps this class exists to avoid: `wait(timeout=)` is an HTTP timeout,
not a job deadline, so a timer here stops a job that overruns; `auto_remove` races
`logs()`/`wait()`, so the container is removed in `close()`; an OOM kill is visible only as
`State.OOMKilled` after a `reload()`.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import queue
import re
import signal
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import docker.errors
import requests.exceptions
from docker.models.containers import Container

from worker.node.job_files import KILL_GRACE_SECONDS

log = logging.getLogger("reprotrain.agent")
_WAIT_POLL_SECONDS = 30.0  # one HTTP wait at a time, so a restarted engine is noticed
_END = None
_MAX_SIGNAL = 64
_SIGNAL_EXIT_BASE = 128  # docker-init (tini) exits 128+N when its child died of signal N
_ENGINE_ERRORS = (docker.errors.APIError, requests.exceptions.RequestException)
_NANOSECONDS = re.compile(r"(\.\d{6})\d*")  # the engine's timestamps have 9 digits


class ContainerJob:
    """A started container running `python -m worker.run`; always `close()` it."""

    def __init__(
        self,
        container: Container,
        *,
        result_path: Path,
        memory_limit: str | None,
        deadline_seconds: float | None,
    ) -> None:
        self.container = container
        self.failure_reason: str | None = None
        self._result_path = result_path
        self._memory_limit = memory_limit
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._exit_code: int | None = None
        self._deadline_hit = threading.Event()
        self._finished = threading.Event()
        self._reader = threading.Thread(
            target=self._read_logs, name=f"logs-{container.short_id}", daemon=True
        )
        self._reader.start()
        self._timer: threading.Timer | None = None
        if deadline_seconds is not None:
            self._timer = threading.Timer(deadline_seconds, self._expire, args=(deadline_seconds,))
            self._timer.daemon = True
            self._timer.start()

    # -- output ------------------------------------------------------------------------------

    def _read_logs(self) -> None:
        # Docker frames are writes, not lines: a line can span frames, so reassemble here.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        try:
            stream = self.container.logs(stdout=False, stderr=True, stream=True, follow=True)
            for chunk in stream:
                pending += decoder.decode(chunk)
                *lines, pending = pending.split("\n")
                for line in lines:
                    self._lines.put(line)
            pending += decoder.decode(b"", final=True)
            if pending:
                self._lines.put(pending)
        except _ENGINE_ERRORS as exc:  # the engine went away or the container with it
            self._lines.put(f"[reprotrain] the container's log stream broke: {exc}")
        finally:
            self._lines.put(_END)

    def stderr_lines(self) -> Iterator[str]:
        """The job's stderr lines until the container's log stream ends."""
        while (line := self._lines.get()) is not _END:
            yield line

    # -- ending ------------------------------------------------------------------------------

    def wait(self) -> int:
        """The exit code like Popen's (negative: the signal that ended the job)."""
        if self._exit_code is not None:
            return self._exit_code
        while True:
            try:
                status = int(self.container.wait(timeout=_WAIT_POLL_SECONDS)["StatusCode"])
                break
            except (requests.exceptions.ConnectionError, requests.exceptions.Timeout):
                # The HTTP read timed out (the SDK may raise either): is it still running?
                self.container.reload()
                if self.container.status not in ("created", "running", "restarting"):
                    status = int(self.container.attrs["State"]["ExitCode"])
                    break
        self._finished.set()
        if self._timer is not None:
            self._timer.cancel()
        code = status
        if _SIGNAL_EXIT_BASE < status <= _SIGNAL_EXIT_BASE + _MAX_SIGNAL:
            code = -(status - _SIGNAL_EXIT_BASE)
        self._note_oom()
        if self._deadline_hit.is_set():
            self._void_result()
        self._exit_code = code
        return code

    def _note_oom(self) -> None:
        try:
            self.container.reload()
        except _ENGINE_ERRORS:
            return
        if self.container.attrs.get("State", {}).get("OOMKilled"):
            limit = self._memory_limit or "the host's memory"
            self.failure_reason = f"out of memory (limit {limit})"

    def _void_result(self) -> None:
        # A job stopped at its deadline writes an "interrupted" result, which would make the
        # agent hand the run back to the queue to overrun again; without a result document
        # the run fails, with failure_reason saying why.
        with contextlib.suppress(FileNotFoundError):
            self._result_path.rename(self._result_path.with_name("result.deadline.json"))

    def _expire(self, seconds: float) -> None:
        if self._finished.is_set():
            return
        self._deadline_hit.set()
        self.failure_reason = f"deadline exceeded (the job ran longer than {seconds:g} s)"
        log.warning("container %s: %s; stopping it", self.container.short_id, self.failure_reason)
        try:
            self.send_signal(signal.SIGTERM)
            if not self._finished.wait(KILL_GRACE_SECONDS):
                self.send_signal(signal.SIGKILL)
        except _ENGINE_ERRORS as exc:  # the agent's close() removes it in any case
            log.warning("container %s could not be stopped: %s", self.container.short_id, exc)

    def send_signal(self, sig: int) -> None:
        """Signal the job's process (docker-init passes it on); nothing once it has ended."""
        name = signal.Signals(sig).name
        try:
            self.container.kill(signal=name)
        except docker.errors.APIError as exc:
            # 409: not running any more (it ended on its own meanwhile); 404: removed.
            if exc.status_code not in (404, 409):
                raise

    def close(self) -> None:
        """Kill the container if it still runs and remove it."""
        if self._timer is not None:
            self._timer.cancel()
        self._finished.set()
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except _ENGINE_ERRORS as exc:  # the next agent start reaps it (it is labelled)
            log.warning("container %s not removed: %s", self.container.short_id, exc)
        self._reader.join(timeout=KILL_GRACE_SECONDS)


class OrphanedContainer:
    """A job container whose agent is gone: followed again as a job, or removed."""

    def __init__(
        self,
        container: Container,
        *,
        run_id: str,
        workspace_mount: Path,
        memory_limit: str | None,
        deadline_seconds: float | None,
    ) -> None:
        self.container = container
        self.run_id = run_id
        self.state = str(container.status)  # "running", "exited", "created", ...
        self.ended = self.state == "exited"
        # The host directory mounted as the job's workspace: where its result is written.
        self.workspace = next(
            (
                Path(str(mount["Source"]))
                for mount in container.attrs.get("Mounts") or []
                if mount.get("Destination") == str(workspace_mount) and mount.get("Source")
            ),
            None,
        )
        self._memory_limit = memory_limit
        self._deadline_seconds = deadline_seconds

    def describe(self) -> str:
        """How the log names it."""
        return f"container {self.container.short_id}"

    def follow(self, result_path: Path) -> ContainerJob:
        """The container as a job: its stderr from its start, its exit, what is left of its
        deadline (counted from when it started)."""
        return ContainerJob(
            self.container,
            result_path=result_path,
            memory_limit=self._memory_limit,
            # One that ended on its own, in time or not, keeps its result.
            deadline_seconds=None if self.ended else self._deadline_left(),
        )

    def _deadline_left(self) -> float | None:
        if self._deadline_seconds is None:
            return None
        state = self.container.attrs.get("State")  # a string in a sparse listing
        started = str(state.get("StartedAt", "")) if isinstance(state, dict) else ""
        try:
            since = datetime.fromisoformat(_NANOSECONDS.sub(r"\1", started))
        except ValueError:  # the engine does not say: the whole deadline from now
            return self._deadline_seconds
        return max(self._deadline_seconds - (datetime.now(UTC) - since).total_seconds(), 0.0)

    def remove(self, why: str) -> None:
        """Kill it if it still runs and remove it, saying why."""
        log.warning("removing %s of run %s: %s", self.describe(), self.run_id or "?", why)
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:  # removed by someone else meanwhile
            pass
        except _ENGINE_ERRORS as exc:  # still labelled: the next agent start tries again
            log.warning("%s not removed: %s", self.describe(), exc)
