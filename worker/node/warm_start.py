"""Warm starts: the next job's interpreter, started while the worker is idle.

A warm interpreter (`python -m worker.training.warm_run`) has imported TensorFlow and what a job
imports, and initialised nothing a spec sets. A claimed job is handed to it only when it
needs exactly the start-up environment the interpreter was started with (PYTHONHASHSEED,
the determinism and thread variables, everything else the job's environment holds) and
no code bundle; otherwise the interpreter is discarded and the job starts cold. A worker
that trusts code bundles keeps no warm interpreter at all: a bundle's job runs as the same
user and could reach into the one waiting for the next job (ProcessExecutor).
TensorFlow-free.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
from collections.abc import Mapping

from worker.node.executors.base import JobRequest
from worker.record.environment_capture import EXPORT_MODEL_ENV, KEY_ENV, NUMERIC_ENV

log = logging.getLogger("reprotrain.agent")

# Read by a job only after its start-up (provenance capture, model export), so a warm
# interpreter may be handed them with the job.
LATE_VARIABLES = frozenset({KEY_ENV, NUMERIC_ENV, EXPORT_MODEL_ENV})


def startup_part(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of a job's environment that must be there when its interpreter starts."""
    return {name: value for name, value in env.items() if name not in LATE_VARIABLES}


class WarmInterpreter:
    """One started `worker.training.warm_run` process, waiting for its job on stdin."""

    def __init__(self, env: Mapping[str, str], popen_options: Mapping[str, object]) -> None:
        self.env = dict(env)
        ready_read, ready_write = os.pipe()
        try:
            self.proc: subprocess.Popen[str] = subprocess.Popen(  # type: ignore[call-overload]
                [sys.executable, "-m", "worker.training.warm_run", "--ready-fd", str(ready_write)],
                env=self.env,
                stdin=subprocess.PIPE,
                pass_fds=(ready_write,),
                **popen_options,
            )
        except BaseException:
            os.close(ready_read)
            raise
        finally:
            os.close(ready_write)
        self._ready_fd: int | None = ready_read

    @property
    def pid(self) -> int:
        """The interpreter's process id."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the interpreter still runs."""
        return self.proc.poll() is None

    def wait_ready(self, timeout: float) -> bool:
        """Whether it has finished its imports within `timeout` seconds (False: died or not)."""
        if self._ready_fd is None:
            return self.alive()
        readable, _, _ = select.select([self._ready_fd], [], [], timeout)
        if not readable:
            return False
        self._close_ready()
        return self.alive()

    def fits(self, env: Mapping[str, str], request: JobRequest) -> bool:
        """Whether the job can run here: same start-up environment, no code bundle."""
        # A bundle is installed into the job's own site and loaded before anything else it
        # runs; a process that imported the job's modules already is no place for it.
        return request.code_file is None and startup_part(env) == startup_part(self.env)

    def hand_over(self, argv: list[str], env: Mapping[str, str]) -> bool:
        """Give the interpreter its job; False if it died first (then it is reaped)."""
        assert self.proc.stdin is not None
        line = json.dumps({"argv": argv, "env": dict(env)}) + "\n"
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            self.discard()
            return False
        self._close_ready()
        return True

    def discard(self) -> None:
        """Kill and reap the interpreter, and close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._close_ready()

    def _close_ready(self) -> None:
        if self._ready_fd is not None:
            os.close(self._ready_fd)
            self._ready_fd = None
