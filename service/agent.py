"""The worker agent: registers, claims runs, runs each job in a fresh process and reports.

Per job the agent's own thread reads the job's stderr; beside it a heartbeat thread keeps
the lease and an upload thread sends checkpoints in the order the job wrote them, so a slow
upload never stalls training on a full stderr pipe.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from service.client import ApiClient, ApiError, ApiUnreachable, Id, LeaseLost
from service.job_process import (
    KILL_GRACE_SECONDS,
    StderrTail,
    Upload,
    checkpoint_downloads,
    checkpoint_uploads,
    describe_exit,
    job_environment,
    pdeathsig_preexec,
)
from worker.executor import job_command
from worker.gpu_info import gpu_devices
from worker.progress import parse_line
from worker.result import read_result

log = logging.getLogger("reprotrain.agent")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
_MAX_BACKOFF = 30.0  # seconds between attempts while the API is down
PROGRESS_SECONDS = 1.0  # at most one progress update a second
CLAIM_WAIT_SECONDS = 20.0  # how long an idle worker's claim waits on the server (long poll)


def _transient(exc: ApiError) -> bool:
    return isinstance(exc, ApiUnreachable) or (exc.status_code or 0) >= 500


class _Job:
    """A claimed run's process and the state the agent's threads share about it."""

    def __init__(self, run_id: Id, proc: subprocess.Popen[str]) -> None:
        self.run_id = run_id
        self.proc = proc
        self.progress: dict[str, Any] | None = None
        self.abandoned = threading.Event()
        self.reported = threading.Event()
        self._lock = threading.Lock()

    def abandon(self, why: str) -> None:
        """Give the run up: stop the job (SIGTERM, then SIGKILL) and report nothing more."""
        with self._lock:
            if self.abandoned.is_set():
                return
            self.abandoned.set()
        log.warning("run %s abandoned: %s", self.run_id, why)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(KILL_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Agent:
    """Claims runs from the API one at a time and runs each as a fresh job process."""

    def __init__(
        self,
        client: ApiClient,
        *,
        name: str,
        work_dir: Path,
        poll_interval: float = 1.0,
        claim_wait: float = CLAIM_WAIT_SECONDS,
        images: Sequence[str] = (),
        max_jobs: int | None = None,
    ) -> None:
        self.client = client
        self.name = name
        self.work_dir = Path(work_dir)
        self.poll_interval = poll_interval
        self.claim_wait = claim_wait
        self.images = list(images)
        self.max_jobs = max_jobs
        self.worker_id: Id | None = None
        self.lease_seconds = 60.0
        self.heartbeat_seconds = 10.0
        self._stop = threading.Event()
        # Reentrant: request_stop may run in a signal handler that interrupted a holder.
        self._lock = threading.RLock()
        self._stops = 0
        self._job: _Job | None = None
        self._claim_delay = poll_interval

    # -- stopping ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop gracefully: the job checkpoints at its epoch end; a second call kills it."""
        with self._lock:
            self._stops += 1
            force = self._stops > 1
            job = self._job
            self._stop.set()
        if job is not None:
            log.info("stop requested: %s", "killing the job" if force else "ending at epoch end")
            job.proc.send_signal(signal.SIGKILL if force else signal.SIGTERM)

    def install_signal_handlers(self) -> None:
        """Make SIGTERM and SIGINT request a stop (call from the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signal handlers can only be installed from the main thread")
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.request_stop())

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        """Register, then claim and run jobs until stopped or `max_jobs` jobs are done."""
        if not self._register():
            return
        done = 0
        while not self._stop.is_set() and (self.max_jobs is None or done < self.max_jobs):
            asked = time.monotonic()
            claim = self._claim()
            if claim is None:
                # A server that held the claim has waited already; one that answered at once
                # (no long polls, or an error) is asked again after the poll interval.
                if time.monotonic() - asked < self.claim_wait / 2:
                    self._stop.wait(self.poll_interval)
                continue
            self._process(claim)
            done += 1
        log.info("worker %s stopping after %d job(s)", self.worker_id, done)

    def _register(self) -> bool:
        gpus = gpu_devices()
        delay = self.poll_interval
        while not self._stop.is_set():
            try:
                info = self.client.register(
                    self.name,
                    executors=["process"],
                    images=self.images,
                    gpu=gpus[0].get("name") if gpus else None,
                    hostname=socket.gethostname(),
                )
            except ApiError as exc:
                if not _transient(exc):
                    raise
                log.warning("cannot register (%s); retrying in %.1f s", exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, _MAX_BACKOFF)
                continue
            self.worker_id = info["id"]
            self.lease_seconds = float(info["lease_seconds"])
            self.heartbeat_seconds = float(info["heartbeat_seconds"])
            log.info("registered as worker %s (%s)", self.worker_id, self.name)
            return True
        return False

    def _claim(self) -> dict[str, Any] | None:
        try:
            claim = self._ask_for_run()
            self._claim_delay = self.poll_interval
            return claim
        except ApiError as exc:
            if exc.status_code == 404:  # e.g. a fresh API database: introduce ourselves again
                log.warning("the API does not know worker %s; registering again", self.worker_id)
                self._register()
            elif not _transient(exc):
                raise
            else:  # back off, so an API outage costs neither it nor the log much
                log.warning("claim failed (%s); next try in %.1f s", exc, self._claim_delay)
                self._stop.wait(self._claim_delay)
                self._claim_delay = min(self._claim_delay * 2, _MAX_BACKOFF)
            return None

    def _ask_for_run(self) -> dict[str, Any] | None:
        """One claim; a long poll runs on its own thread so that a stop ends the wait at once."""
        if self.claim_wait <= 0:
            return self.client.claim(self._wid)
        answer: queue.Queue[tuple[dict[str, Any] | None, ApiError | None]] = queue.Queue(1)
        wid = self._wid

        def ask() -> None:
            try:
                answer.put((self.client.claim(wid, wait=self.claim_wait), None))
            except ApiError as exc:
                answer.put((None, exc))
            except Exception as exc:  # e.g. the client closed under a stopping agent
                answer.put((None, ApiUnreachable(None, repr(exc))))

        threading.Thread(target=ask, name="claim", daemon=True).start()
        while True:
            try:
                claim, error = answer.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    self._release_late(answer, wid)
                    return None
                continue
            if error is not None:
                raise error
            return claim

    def _release_late(
        self, answer: queue.Queue[tuple[dict[str, Any] | None, ApiError | None]], wid: Id
    ) -> None:
        # Stopping with a long poll out: should it still bring a run, hand that run back. (If
        # the process exits first the server sees the connection gone and leases nothing.)
        def release() -> None:
            claim, _ = answer.get()
            if claim is not None:
                run_id = claim["run"]["id"]
                log.info("run %s claimed while stopping; releasing it", run_id)
                with contextlib.suppress(Exception):
                    self.client.release(run_id, wid, "the worker stopped while claiming")

        threading.Thread(target=release, name="claim-release", daemon=True).start()

    # -- one run -----------------------------------------------------------------------------

    @property
    def _wid(self) -> Id:
        assert self.worker_id is not None, "register first"
        return self.worker_id

    def _process(self, claim: dict[str, Any]) -> None:
        run_id: Id = claim["run"]["id"]
        try:
            self._execute(claim)
        except Exception as exc:  # the agent's own failure around this run: report, go on
            log.exception("run %s: the agent failed around the job", run_id)
            tb = traceback.format_exc()
            error = {"type": type(exc).__name__, "message": str(exc), "traceback": tb}
            self._deliver(None, run_id, "fail", lambda: self.client.fail(run_id, self._wid, error))

    def _execute(self, claim: dict[str, Any]) -> None:
        run = claim["run"]
        run_id: Id = run["id"]
        attempt = int(run.get("attempt", 1))
        if not _SAFE_ID.match(str(run_id)):  # it becomes a directory name
            raise ValueError(f"unexpected run id {run_id!r}")
        attempt_dir = self.work_dir / "runs" / str(run_id) / f"attempt-{attempt}"
        shutil.rmtree(attempt_dir, ignore_errors=True)  # leftovers of an agent that died
        ckpt_dir = attempt_dir / "checkpoints"
        ckpt_dir.mkdir(parents=True)
        spec_path = attempt_dir / "spec.json"
        spec_path.write_text(json.dumps(run["spec"], indent=1))
        resume = self._fetch_checkpoint(run_id, claim.get("checkpoint"), ckpt_dir)
        log.info("run %s attempt %d claimed%s", run_id, attempt, " (resuming)" if resume else "")
        if self._stop.is_set():  # stopped while downloading: do not start a job only to stop it
            self._release(None, run_id, "worker shutting down")
            return
        lease_seconds = float((claim.get("lease") or {}).get("seconds", self.lease_seconds))
        result_path = attempt_dir / "result.json"
        started = time.monotonic()
        limit = (claim.get("limits") or {}).get("max_model_parameters")
        options = claim.get("job") or {}
        job = _Job(
            run_id, self._start_job(spec_path, result_path, ckpt_dir, resume, limit, options)
        )
        with self._lock:
            self._job = job
            stops = self._stops
        if stops:  # asked to stop while the job was being started
            job.proc.send_signal(signal.SIGKILL if stops > 1 else signal.SIGTERM)
        uploads: queue.Queue[Upload | None] = queue.Queue()
        uploader = threading.Thread(target=self._upload_loop, args=(job, uploads), daemon=True)
        beater = threading.Thread(
            target=self._heartbeat_loop, args=(job, lease_seconds), daemon=True
        )
        uploader.start()
        beater.start()
        try:
            tail = StderrTail()
            try:
                self._read_job_output(job, ckpt_dir, attempt_dir / "job.log", tail, uploads)
                code = job.proc.wait()
            except BaseException:
                job.proc.kill()
                job.proc.wait()
                raise
            finally:
                with self._lock:
                    self._job = None
                uploads.put(None)
                uploader.join()  # every checkpoint is in before the run is reported
            self._report(job, code, result_path, tail, time.monotonic() - started)
        finally:
            job.reported.set()  # heartbeats go on until here: uploads can outlast the job
            beater.join()
            shutil.rmtree(ckpt_dir, ignore_errors=True)  # uploaded, or superseded by the API's

    def _start_job(
        self,
        spec_path: Path,
        result_path: Path,
        ckpt_dir: Path,
        resume: bool,
        max_model_parameters: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> subprocess.Popen[str]:
        options = options or {}
        return subprocess.Popen(
            job_command(
                spec_path,
                result_path,
                checkpoint_dir=ckpt_dir,
                resume=resume,
                max_model_parameters=max_model_parameters,
                trace_every_steps=options.get("trace_every_steps"),
                until_epoch=options.get("until_epoch"),
            ),
            env=job_environment(),
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

    def _fetch_checkpoint(self, run_id: Id, offer: dict[str, Any] | None, directory: Path) -> bool:
        if not offer:
            return False
        try:
            for entry in checkpoint_downloads(offer["files"]):
                name, digest = str(entry["name"]), str(entry["sha256"])
                self.client.download_artifact(entry["artifact_id"], directory / name, sha256=digest)
        except (ApiError, OSError, ValueError, KeyError, TypeError) as exc:
            # Training from the start gives the same bits as resuming, only later.
            log.warning("run %s: offered checkpoint unusable (%s); starting over", run_id, exc)
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            return False
        return True

    def _read_job_output(
        self,
        job: _Job,
        ckpt_dir: Path,
        log_path: Path,
        tail: StderrTail,
        uploads: queue.Queue[Upload | None],
    ) -> None:
        assert job.proc.stderr is not None
        with open(log_path, "w", encoding="utf-8") as job_log:
            for raw in job.proc.stderr:
                line = raw.rstrip("\n")
                event = parse_line(line)
                if event is None:
                    tail.add(line)
                    job_log.write(raw)
                    continue
                job.progress = event
                if event["event"] == "checkpoint" and not job.abandoned.is_set():
                    try:
                        uploads.put(checkpoint_uploads(ckpt_dir, event))
                    except ValueError as exc:
                        log.warning("run %s: %s", job.run_id, exc)

    def _upload_loop(self, job: _Job, uploads: queue.Queue[Upload | None]) -> None:
        while (item := uploads.get()) is not None:
            epoch, *paths = item
            if job.abandoned.is_set():
                continue
            try:
                for path in paths:  # npz first: the API counts a checkpoint once its json is in
                    self.client.upload_artifact(
                        job.run_id, self._wid, path, kind="checkpoint", name=path.name, epoch=epoch
                    )
                log.debug("run %s: checkpoint of epoch %d uploaded", job.run_id, epoch)
            except LeaseLost as exc:
                job.abandon(f"lease lost while uploading ({exc.detail})")
            except (ApiError, OSError) as exc:  # a later resume starts from an older checkpoint
                log.warning(
                    "run %s: checkpoint of epoch %d not uploaded: %s", job.run_id, epoch, exc
                )

    def _heartbeat_loop(self, job: _Job, lease_seconds: float) -> None:
        # Heartbeats keep the lease every `heartbeat_seconds`; new progress goes out sooner
        # (at most once a second) so progress bars and event streams stay live.
        deadline = time.monotonic() + lease_seconds
        due = time.monotonic() + self.heartbeat_seconds
        sent_progress: dict[str, Any] | None = None
        while not job.reported.wait(PROGRESS_SECONDS) and not job.abandoned.is_set():
            progress = job.progress
            if time.monotonic() < due and progress is sent_progress:
                continue
            sent = time.monotonic()
            try:
                self.client.heartbeat(job.run_id, self._wid, progress)
            except LeaseLost as exc:
                job.abandon(f"lease lost ({exc.detail})")
                return
            except ApiError as exc:
                if not _transient(exc):
                    job.abandon(f"heartbeat refused: {exc}")
                    return
                if time.monotonic() >= deadline:
                    job.abandon(f"lease expired while the API was unreachable ({exc})")
                    return
                log.warning("run %s: heartbeat failed (%s); retrying", job.run_id, exc)
                continue
            except Exception:  # never let a bug end the heartbeats silently
                log.exception("run %s: heartbeat thread error", job.run_id)
                continue
            deadline, due, sent_progress = (
                sent + lease_seconds,
                sent + self.heartbeat_seconds,
                progress,
            )

    def _report(
        self, job: _Job, code: int, result_path: Path, tail: StderrTail, seconds: float
    ) -> None:
        if job.abandoned.is_set():
            return
        run_id = job.run_id
        try:
            result = read_result(result_path)
        except (OSError, ValueError) as exc:
            if self._stop.is_set():  # we stopped it before it could write a result
                self._release(job, run_id, "worker shutting down")
                return
            log.info("run %s crashed: %s, no result document", run_id, describe_exit(code))
            error = {
                "type": "JobCrashed",
                "message": f"the job process ended with {describe_exit(code)} "
                f"without a readable result document ({exc})",
                "traceback": tail.text(),
            }
            self._deliver(job, run_id, "fail", lambda: self.client.fail(run_id, self._wid, error))
            return
        log.info("run %s %s after %.1f s", run_id, result.status, seconds)
        if result.status == "interrupted":
            reason = "worker shutting down" if self._stop.is_set() else "job interrupted"
            self._release(job, run_id, reason)
        else:
            doc = result.model_dump(mode="json")
            self._deliver(
                job, run_id, "complete", lambda: self.client.complete(run_id, self._wid, doc)
            )

    def _release(self, job: _Job | None, run_id: Id, reason: str) -> None:
        self._deliver(
            job, run_id, "release", lambda: self.client.release(run_id, self._wid, reason)
        )

    def _deliver(self, job: _Job | None, run_id: Id, what: str, send: Callable[[], object]) -> None:
        """Send a final report; retry transient errors while the heartbeats keep the lease."""
        delay = 0.5
        while True:
            try:
                send()
                return
            except LeaseLost as exc:
                log.warning("run %s: %s refused, lease lost (%s)", run_id, what, exc.detail)
                return
            except ApiError as exc:
                # Without a job no heartbeat thread tells us when the lease has run out.
                if not _transient(exc) or job is None or job.abandoned.is_set():
                    log.error("run %s: could not %s: %s", run_id, what, exc)
                    return
                log.warning("run %s: %s failed (%s); retrying", run_id, what, exc)
                time.sleep(delay)
                delay = min(delay * 2, _MAX_BACKOFF)


def run_agent(
    api: str,
    token: str | None,
    *,
    name: str | None = None,
    work_dir: Path | None = None,
    poll_interval: float = 1.0,
    claim_wait: float = CLAIM_WAIT_SECONDS,
    max_jobs: int | None = None,
    images: list[str] | None = None,
    install_signals: bool = True,
) -> None:
    """Run a worker agent against the API at `api` until it is stopped."""
    with ApiClient(api, token) as client, contextlib.ExitStack() as stack:
        if work_dir is None:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="repro-")))
        agent = Agent(
            client,
            name=name or f"{socket.gethostname()}-{os.getpid()}",
            work_dir=work_dir,
            poll_interval=poll_interval,
            claim_wait=claim_wait,
            images=images or [],
            max_jobs=max_jobs,
        )
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous = signal.getsignal(sig)
                stack.callback(signal.signal, sig, signal.SIG_DFL if previous is None else previous)
            agent.install_signal_handlers()
        agent.run()
