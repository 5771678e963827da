"""The process executor: one job, one fresh `python -m worker.run` subprocess.

On Kubernetes the worker pod's image is itself the pinned environment, so a job is a child
of the agent in the same environment. TensorFlow-free.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from worker.node.executors.base import JobRequest, export_environment
from worker.result import JobResult, read_result
from worker.training.progress import parse_line

EventHandler = Callable[[dict[str, Any]], None]
_PR_SET_PDEATHSIG = 1


def pdeathsig_preexec(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A Popen `preexec_fn` that makes the child get `sig` when its parent dies; None off Linux.

    Linux sends the signal when the *thread* that started the child exits, so the thread
    that calls Popen must outlive the child (the agent waits for its job in that thread).
    """
    if not sys.platform.startswith("linux"):
        return None
    # Look prctl up before fork, so the child runs as little code as possible.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before prctl: no signal would ever come
            os.kill(os.getpid(), sig)

    return preexec


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


def job_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a job: the agent's without credentials, quieter TensorFlow, no stale
    re-exec marker. The claim's provenance key is added after this, by the caller."""
    source = os.environ if environ is None else environ
    env = {name: value for name, value in source.items() if not is_credential(name, value)}
    env.pop("REPRO_JOB_REEXEC", None)  # worker.run's marker: it would suppress the job's re-exec
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def job_command(
    spec: Path,
    out: Path,
    *,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    max_model_parameters: int | None = None,
    trace_every_steps: int | None = None,
    until_epoch: int | None = None,
    dataset_file: Path | None = None,
    export_model: Path | None = None,
    code_file: Path | None = None,
    model_file: Path | None = None,
) -> list[str]:
    """The command line that runs one job with this interpreter."""
    cmd = [sys.executable, "-m", "worker.run", "--spec", str(spec), "--out", str(out)]
    if dataset_file is not None:
        cmd += ["--dataset-file", str(dataset_file)]
    if code_file is not None:
        cmd += ["--code-file", str(code_file)]
    if model_file is not None:
        cmd += ["--model-file", str(model_file)]
    if export_model is not None:
        cmd += ["--export-model", str(export_model)]
    if trace_every_steps is not None:
        cmd += ["--trace-every-steps", str(trace_every_steps)]
    if until_epoch is not None:
        cmd += ["--until-epoch", str(until_epoch)]
    if max_model_parameters is not None:
        cmd += ["--max-model-parameters", str(max_model_parameters)]
    if checkpoint_dir is not None:
        cmd += ["--checkpoint-dir", str(checkpoint_dir)]
    if resume:
        cmd.append("--resume")
    return cmd


class ProcessJob:
    """A job subprocess in its own session that dies with the thread that started it."""

    failure_reason: str | None = None

    def __init__(self, request: JobRequest) -> None:
        self._proc = subprocess.Popen(
            job_command(
                request.spec_path,
                request.result_path,
                checkpoint_dir=request.checkpoint_dir,
                resume=request.resume,
                max_model_parameters=request.max_model_parameters,
                trace_every_steps=request.trace_every_steps,
                until_epoch=request.until_epoch,
                dataset_file=request.dataset_file,
                code_file=request.code_file,
                model_file=request.model_file,
            ),
            env={**job_environment(), **request.environment, **export_environment(request)},
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            # Own session: a terminal's Ctrl-C reaches only the agent, which stops the job
            # gracefully instead of the job dying of KeyboardInterrupt mid-epoch.
            start_new_session=True,
            preexec_fn=pdeathsig_preexec(),
        )

    def stderr_lines(self) -> Iterator[str]:
        """The job's stderr lines until it closes its end of the pipe."""
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            yield raw.rstrip("\n")

    def wait(self) -> int:
        """The exit code (negative: the signal that ended the job)."""
        return self._proc.wait()

    def send_signal(self, sig: int) -> None:
        """Signal the job (nothing happens once it has been reaped)."""
        self._proc.send_signal(sig)

    def close(self) -> None:
        """Kill the job if it still runs, reap it and close the pipe."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stderr is not None:
            with contextlib.suppress(OSError):
                self._proc.stderr.close()


class ProcessExecutor:
    """Runs each job as a fresh subprocess of the agent's own environment."""

    kind = "process"

    def __init__(self, *, trust_code: bool = False) -> None:
        # A job here runs as the agent's user: code bundles only when the operator says so.
        self.accepts_code = trust_code

    def advertised_images(self) -> list[str]:
        """None of its own: the operator names the image this environment is (`--image`)."""
        return []

    def image_provenance(self) -> dict[str, Any] | None:
        """None: the job records its own environment (REPRO_IMAGE_REF / _DIGEST if set)."""
        return None

    def start(self, request: JobRequest) -> ProcessJob:
        """Start the job subprocess."""
        return ProcessJob(request)

    def reap_orphans(self) -> None:
        """Nothing to do: a job subprocess dies with its agent (parent-death signal)."""


def run_process_job(
    spec: Path,
    out: Path,
    *,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    on_event: EventHandler | None = None,
    log: Callable[[str], None] | None = None,
    dataset_file: Path | None = None,
    export_model: Path | None = None,
) -> tuple[int, JobResult]:
    """Run a job to completion in the foreground; returns the exit code and its result.

    Progress lines go to `on_event`; the job's other stderr lines go to `log`.
    """
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with subprocess.Popen(
        job_command(
            spec,
            out,
            checkpoint_dir=checkpoint_dir,
            resume=resume,
            dataset_file=dataset_file,
            export_model=export_model,
        ),
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            event = parse_line(line.rstrip("\n"))
            if event is not None:
                if on_event is not None:
                    on_event(event)
            elif log is not None:
                log(line.rstrip("\n"))
        code = proc.wait()
    return code, read_result(out)
