"""What keeps a process job from the agent and from the jobs after it (Linux).

A process job runs as the agent's user, so the agent hides what that user could otherwise
read of it (its memory, the credentials it was started with), and a job's processes end
with the job: its process group is killed whole, and with code bundles trusted the agent is
a child subreaper, so a process that left the group (setsid, a double fork) is re-parented
to the agent when its parent exits and is killed too. TensorFlow-free.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path

log = logging.getLogger("reprotrain.agent")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_STRAY_POLL_SECONDS = 0.01


def _prctl() -> Callable[..., int]:
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def pdeathsig_preexec(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A Popen `preexec_fn` that makes the child get `sig` when its parent dies; None off Linux.

    Linux sends the signal when the *thread* that started the child exits, so the thread
    that calls Popen must outlive the child (the agent waits for its job in that thread).
    """
    if not sys.platform.startswith("linux"):
        return None
    # Look prctl up before fork, so the child runs as little code as possible.
    prctl = _prctl()
    parent = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before prctl: no signal would ever come
            os.kill(os.getpid(), sig)

    return preexec


_PR_SET_DUMPABLE = 4
_ENV_END_FIELD = 51  # of /proc/<pid>/stat, counted from 1


def hide_agent_memory() -> None:
    """Make this process non-dumpable (Linux): a job, which runs as the same user, can then
    read neither its memory nor the environment it was started with (/proc/<agent>/environ
    holds REPRO_TOKEN whatever the job's own environment is). A job's exec makes the job
    itself dumpable again."""
    if not sys.platform.startswith("linux"):
        return
    prctl = _prctl()
    if prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


# A job runs model and generator code the agent does not vouch for, so it sees none of the
# agent's credentials: its worker token, and whatever else the operator's environment holds
# (service settings when the agent runs beside the API, cloud keys, an ssh agent's socket).
_CREDENTIAL_MARKERS = (
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH", "COOKIE",
    "DATABASE", "_DSN", "PRIVATE",
)  # fmt: skip
# A URL with a password in it (a proxy, a database) is a credential whatever its name.
_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*:[^/@\s]*@")


def is_credential(name: str, value: str) -> bool:
    """Whether an environment variable carries a credential the job must not see."""
    upper = name.upper()
    return any(m in upper for m in _CREDENTIAL_MARKERS) or bool(_URL_PASSWORD.search(value))


def _startup_environment_block() -> tuple[int, int] | None:
    """Where the environment this process was started with lies in its memory (Linux)."""
    try:
        stat = Path("/proc/self/stat").read_text()
    except OSError:
        return None
    # Fields after the command name, which may hold spaces: env_start and env_end are the
    # 50th and 51st of the whole line.
    fields = stat.rsplit(")", 1)[1].split()
    if len(fields) < _ENV_END_FIELD - 2:
        return None
    start, end = int(fields[_ENV_END_FIELD - 4]), int(fields[_ENV_END_FIELD - 3])
    return (start, end) if 0 < start < end else None


def hide_startup_credentials() -> None:
    """Blank the credentials in the environment block this process was started with.

    /proc/<pid>/environ shows that block, and a process of the same user may read it even
    when this one is not dumpable; the agent's own copies (os.environ, and the C library's,
    which is re-set here so child processes started without an explicit environment keep
    them) are untouched.
    """
    block = _startup_environment_block()
    if block is None:
        return
    start, end = block
    raw = ctypes.string_at(start, end - start)
    offset = 0
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        text_name, text_value = name.decode(errors="replace"), value.decode(errors="replace")
        if sep and value and is_credential(text_name, text_value):
            if text_name in os.environ:
                os.putenv(text_name, os.environ[text_name])  # a copy of its own for libc
            ctypes.memset(start + offset + len(name) + 1, 0, len(value))
        offset += len(entry) + 1


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux): orphaned descendants are re-parented to
    it rather than to init, so it can find and end them. False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    if _prctl()(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_CHILD_SUBREAPER) failed: errno %d", ctypes.get_errno())
        return False
    return True


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 first)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def start_ticks(pid: int) -> int | None:
    """When a process started, in clock ticks since boot (field 22 of its stat)."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def _job_processes(
    group: int, since: int | None, keep: Collection[int]
) -> tuple[list[int], list[int]]:
    """The live members of the job's process group, and the strays: this process's children
    outside its own session started at `since` or later (None: none are looked for). A job
    runs in a session of its own, which no process can leave for the agent's, so the strays
    are the job's re-parented processes, never the agent's own children (its checks)."""
    me, own_session = os.getpid(), os.getsid(0)
    members, strays = [], []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in keep:
            continue
        fields = _stat_fields(entry.name)
        if fields is None:
            continue
        # From field 3: state, ppid, pgrp, session, ...; field 22 (index 19) the start time.
        state, ppid, pgrp, session = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
        if pgrp == group and state != "Z":
            members.append(int(entry.name))
        if since is not None and ppid == me and session != own_session and int(fields[19]) >= since:
            strays.append(int(entry.name))
    return members, strays


def end_job_processes(
    group: int, *, since: int | None, keep: Collection[int] = (), timeout: float = 5.0
) -> list[int]:
    """SIGKILL a job's process group and, when this process is a subreaper and `since` (the
    job's start, in clock ticks) is given, every process of the job re-parented to it, and
    reap those; returns the processes still alive after `timeout` seconds (none, normally).

    Call it while the job's first process is an unreaped zombie (and pass it in `keep`):
    its pid then still names the group, so no unrelated process can have taken it.
    """
    if not sys.platform.startswith("linux"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
        return []
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
        members, strays = _job_processes(group, since, keep)
        for pid in strays:
            _kill_and_reap(pid)
        if not members and not strays:
            return []
        if time.monotonic() >= deadline:
            return sorted({*members, *strays})
        time.sleep(_STRAY_POLL_SECONDS)


def _kill_and_reap(pid: int) -> None:
    """SIGKILL a child and reap it if it has died already (else a later round does)."""
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, os.WNOHANG)
