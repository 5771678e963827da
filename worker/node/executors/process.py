"""The process executor: one job, one fresh `python -m worker.run` subprocess.

On Kubernetes the worker pod's image is itself the pinned environment, so a job is a child
of the agent in the same environment. The job starts with the environment its spec's
determinism needs (so it never re-executes itself), and, with warm starts on, in an
interpreter the agent started while idle when that environment is the one it was started
with (worker/node/warm_start.py). TensorFlow-free.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from worker.errors import SpecError
from worker.node.executors.base import JobRequest, export_environment
from worker.node.executors.process_isolation import (
    become_subreaper,
    end_job_processes,
    hide_agent_memory,
    hide_startup_credentials,
    is_credential,
    pdeathsig_preexec,
    start_ticks,
)
from worker.node.warm_start import WarmInterpreter, startup_part
from worker.result import JobResult, read_result
from worker.spec import DeterminismSpec, load_spec
from worker.training.determinism import required_environment
from worker.training.progress import parse_line

EventHandler = Callable[[dict[str, Any]], None]
log = logging.getLogger("reprotrain.agent")


def job_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a job: the agent's without credentials, quieter TensorFlow, no stale
    re-exec marker. The claim's provenance key is added after this, by the caller."""
    source = os.environ if environ is None else environ
    env = {name: value for name, value in source.items() if not is_credential(name, value)}
    env.pop("REPRO_JOB_REEXEC", None)  # worker.run's marker: it would suppress the job's re-exec
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
# A reference pinned by digest: `registry/repository@sha256:<hex>` (a tag before @ allowed).
IMAGE_DIGEST = re.compile(r"^[a-z0-9][a-z0-9._/:-]*(?::[\w][\w.-]{0,127})?@sha256:[0-9a-f]{64}$")


class ImageIdentityRefused(ValueError):
    """The image identity the agent was told is not one: runs would record a wrong image."""


def told_images(environ: Mapping[str, str] | None = None) -> list[str]:
    """The identities of the image the agent runs in, as set in its environment: the image ID
    (what the docker executor pins) and the registry digest (what Kubernetes pulls by).

    ImageIdentityRefused for a value that is not one (a placeholder such as `unset`, a tag
    without a digest): provenance would record it and reruns would be pinned to it."""
    source = os.environ if environ is None else environ
    told = {name: source.get(name, "").strip() for name in ("REPRO_IMAGE_ID", "REPRO_IMAGE_DIGEST")}
    checks = {"REPRO_IMAGE_ID": (IMAGE_ID, "sha256:<64 hex>, as `docker image inspect "
              "--format '{{.Id}}'` prints it"),
              "REPRO_IMAGE_DIGEST": (IMAGE_DIGEST, "REPOSITORY@sha256:<64 hex>, the reference "
              "the pod's image is pulled by")}  # fmt: skip
    for name, value in told.items():
        pattern, form = checks[name]
        if value and not pattern.fullmatch(value):
            raise ImageIdentityRefused(
                f"{name}={value!r} is not an image identity: it must be {form}; set both from "
                "one step (deploy/kubernetes/pin-image.sh) or leave them unset"
            )
    return list(dict.fromkeys(value for value in told.values() if value))


def job_command(
    spec: Path,
    out: Path,
    *,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    max_model_parameters: int | None = None,
    max_activation_elements: int | None = None,
    trace_every_steps: int | None = None,
    until_epoch: int | None = None,
    until_step: int | None = None,
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
    if until_step is not None:
        cmd += ["--until-step", str(until_step)]
    if max_model_parameters is not None:
        cmd += ["--max-model-parameters", str(max_model_parameters)]
    if max_activation_elements is not None:
        cmd += ["--max-activation-elements", str(max_activation_elements)]
    if checkpoint_dir is not None:
        cmd += ["--checkpoint-dir", str(checkpoint_dir)]
    if resume:
        cmd.append("--resume")
    return cmd


def determinism_environment(spec_path: Path) -> dict[str, str] | None:
    """What the spec's determinism needs at interpreter start; None if the spec is unreadable
    (the job then reports it, and re-executes itself should it need to)."""
    try:
        spec = load_spec(spec_path)
    except (SpecError, OSError, ValueError):
        return None
    return required_environment(spec.determinism)


def request_environment(request: JobRequest) -> dict[str, str]:
    """The whole environment of the request's job."""
    env = {**job_environment(), **request.environment, **export_environment(request)}
    return {**env, **(determinism_environment(request.spec_path) or {})}


def request_command(request: JobRequest) -> list[str]:
    """The command line of the request's job."""
    return job_command(
        request.spec_path,
        request.result_path,
        checkpoint_dir=request.checkpoint_dir,
        resume=request.resume,
        max_model_parameters=request.max_model_parameters,
        max_activation_elements=request.max_activation_elements,
        trace_every_steps=request.trace_every_steps,
        until_epoch=request.until_epoch,
        until_step=request.until_step,
        dataset_file=request.dataset_file,
        code_file=request.code_file,
        model_file=request.model_file,
    )


def _popen_options() -> dict[str, Any]:
    """How every job process is started, cold or warm."""
    return {
        "stderr": subprocess.PIPE,
        "text": True,
        "encoding": "utf-8",
        "errors": "replace",
        # Own session: a terminal's Ctrl-C reaches only the agent, which stops the job
        # gracefully instead of the job dying of KeyboardInterrupt mid-epoch.
        "start_new_session": True,
        "preexec_fn": pdeathsig_preexec(),
    }


class ProcessJob:
    """A job subprocess in its own session that dies with the thread that started it; when
    it ends, so does every other process of its group (and of it at all, if `contain`)."""

    failure_reason: str | None = None

    def __init__(
        self,
        request: JobRequest,
        *,
        proc: subprocess.Popen[str] | None = None,
        warm: bool = False,
        contain: bool = False,
    ) -> None:
        self.warm = warm  # started in a warm interpreter
        self._proc: subprocess.Popen[str] = proc or subprocess.Popen(
            request_command(request),
            env=request_environment(request),
            stdin=subprocess.DEVNULL,
            **_popen_options(),
        )
        # Contained (the agent is a subreaper): processes of the job that left its group are
        # found among the agent's children by their start, no earlier than the job's.
        self._since = start_ticks(self._proc.pid) if contain else None
        self._result_path = request.result_path
        self._ended = False

    @property
    def pid(self) -> int:
        """The job's process id."""
        return self._proc.pid

    def stderr_lines(self) -> Iterator[str]:
        """The job's stderr lines until it closes its end of the pipe."""
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            yield raw.rstrip("\n")

    def wait(self) -> int:
        """The exit code (negative: the signal that ended the job); every other process of
        the job has been killed by the time it returns, so none writes its files later."""
        if self._proc.returncode is None:
            with contextlib.suppress(ChildProcessError):  # exited, left unreaped (WNOWAIT)
                os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOWAIT)
            self._end_the_rest()
        return self._proc.wait()

    def send_signal(self, sig: int) -> None:
        """Signal the job (nothing happens once it has been reaped)."""
        self._proc.send_signal(sig)

    def close(self) -> None:
        """Kill the job and what it started if they still run, reap them, close the pipe."""
        if self._proc.poll() is None:
            self._proc.kill()
        self.wait()
        if self._proc.stderr is not None:
            with contextlib.suppress(OSError):
                self._proc.stderr.close()

    def _end_the_rest(self) -> None:
        if self._ended:
            return
        self._ended = True
        pid = self._proc.pid
        left = end_job_processes(pid, since=self._since, keep=(pid,))
        if left:
            # They could still write the result: the run fails rather than take it.
            self.failure_reason = f"processes {left} of the job could not be killed"
            log.error("job %d: %s; its result is not used", pid, self.failure_reason)
            with contextlib.suppress(FileNotFoundError):
                self._result_path.rename(self._result_path.with_name("result.untrusted.json"))


class ProcessExecutor:
    """Runs each job as a subprocess of the agent's own environment, warm when it can."""

    kind = "process"

    def __init__(self, *, trust_code: bool = False, warm_start: bool = True) -> None:
        # A job here runs as the agent's user: code bundles only when the operator says so.
        self.accepts_code = trust_code
        # A trusted bundle runs as the user the warm interpreter runs as, and could read or
        # write that interpreter (its memory, its environment) before the next job, of
        # someone else, is handed to it: with bundles trusted, every job starts cold.
        self.warm_start = warm_start and not trust_code
        if warm_start and trust_code:
            log.info("warm starts are off: code bundles are trusted, so every job starts cold")
        # Bundle code may start processes that leave the job's group (setsid, double fork):
        # as subreaper the agent inherits them when their parent exits, and kills them.
        self.contain = trust_code and become_subreaper()
        self._warm: WarmInterpreter | None = None
        # The start-up environment the next job most likely needs: the last job's.
        self._next_startup: dict[str, str] | None = None
        # What the job must not see of the agent: its memory, and the credentials it was
        # started with (REPRO_TOKEN), which /proc/<agent>/environ would show the job.
        hide_agent_memory()
        hide_startup_credentials()

    def advertised_images(self) -> list[str]:
        """The image this environment is, as its pod or host was told it (REPRO_IMAGE_ID, the
        config digest, and REPRO_IMAGE_DIGEST, the registry's); `--image` adds more."""
        return told_images()

    def image_provenance(self) -> dict[str, Any] | None:
        """None: the job records its own environment (REPRO_IMAGE_REF / _DIGEST if set)."""
        return None

    def prepare(self) -> None:
        """While idle: have a warm interpreter for the next job, replacing one that died.

        Call it from the thread that starts jobs: the interpreter dies with that thread.
        """
        if not self.warm_start:
            return
        if self._warm is not None and not self._warm.alive():
            log.warning("warm interpreter %d ended on its own; starting another", self._warm.pid)
            self.discard_warm()
        if self._warm is None:
            guess = {**job_environment(), **required_environment(DeterminismSpec())}
            env = startup_part(self._next_startup or guess)
            self._warm = WarmInterpreter(env, _popen_options())

    def warm_pid(self) -> int | None:
        """The process id of the waiting warm interpreter, if there is one."""
        return None if self._warm is None else self._warm.pid

    def wait_warm(self, timeout: float) -> bool:
        """Whether the warm interpreter has finished its imports within `timeout` seconds."""
        return self._warm is not None and self._warm.wait_ready(timeout)

    def discard_warm(self) -> None:
        """Kill and reap the warm interpreter, if any (the agent calls it when it stops)."""
        warm, self._warm = self._warm, None
        if warm is not None:
            warm.discard()

    def start(self, request: JobRequest) -> ProcessJob:
        """Start the job subprocess: in the warm interpreter if it fits, else a fresh one."""
        env = request_environment(request)
        self._next_startup = startup_part(env)
        warm, self._warm = self._warm, None
        if warm is not None:
            known = determinism_environment(request.spec_path) is not None
            if known and warm.alive() and warm.fits(env, request):
                if warm.hand_over(request_command(request)[3:], env):
                    log.info("run %s: job handed to warm interpreter %d", request.run_id, warm.pid)
                    return ProcessJob(request, proc=warm.proc, warm=True)
            else:
                why = "does not fit the spec" if warm.alive() else "has died"
                log.info("run %s: warm interpreter %s; starting cold", request.run_id, why)
            warm.discard()
        return ProcessJob(request, contain=self.contain)

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
    env.update(determinism_environment(spec) or {})  # so the job need not re-execute itself
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
