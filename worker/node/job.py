"""One claimed run on this node: lay out its workspace, start its job, follow it, report.

The agent's own thread reads the job's stderr; beside it a heartbeat thread keeps the lease
and an upload thread sends checkpoints in the order the job wrote them, so a slow upload
never stalls training on a full stderr pipe. The final report goes through the outbox.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from worker.node.client import ApiClient, ApiError, Id, LeaseLost
from worker.node.executors import Executor, JobHandle, JobRequest
from worker.node.job_files import (
    KILL_GRACE_SECONDS,
    StderrTail,
    Upload,
    checkpoint_downloads,
    checkpoint_uploads,
    describe_exit,
    job_file_bounds,
)
from worker.node.job_workspace import JobWorkspace, UnsafeJobFile
from worker.node.liveness import mark_alive
from worker.node.reports import Outbox, Report, ReportKind
from worker.node.run_inputs import InputUnavailable, fetch_inputs
from worker.record.environment_capture import claim_environment
from worker.result import JobResult
from worker.training.progress import parse_line

log = logging.getLogger("reprotrain.agent")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
PROGRESS_SECONDS = 1.0  # at most one progress update a second
MODEL_FILE = "model.keras"  # the final model a succeeded job exports, uploaded as kind "model"


class Job:
    """A claimed run's job and the state the agent's threads share about it."""

    def __init__(self, run_id: Id, handle: JobHandle) -> None:
        self.run_id = run_id
        self.handle = handle
        self.progress: dict[str, Any] | None = None
        self.abandoned = threading.Event()
        self.ended = threading.Event()  # the job has exited and been waited for
        self.reported = threading.Event()  # heartbeats stop here
        self._lock = threading.Lock()

    def abandon(self, why: str) -> None:
        """Give the run up: stop the job (SIGTERM, then SIGKILL) and report nothing more."""
        with self._lock:
            if self.abandoned.is_set():
                return
            self.abandoned.set()
        log.warning("run %s abandoned: %s", self.run_id, why)
        if self.ended.is_set():
            return
        self.handle.send_signal(signal.SIGTERM)
        if not self.ended.wait(KILL_GRACE_SECONDS):
            self.handle.send_signal(signal.SIGKILL)


# Called with the started job (returns how many stops were requested so far), then with None.
JobWatcher = Callable[[Job | None], int]


class ClaimedRun:
    """Runs one claim to its final report (which the caller delivers)."""

    def __init__(
        self,
        claim: dict[str, Any],
        *,
        client: ApiClient,
        executor: Executor,
        worker_id: Id,
        work_dir: Path,
        stop: threading.Event,
        watch: JobWatcher,
        outbox: Outbox,
        lease_seconds: float,
        heartbeat_seconds: float,
    ) -> None:
        self.claim = claim
        self.client = client
        self.executor = executor
        self.worker_id = worker_id
        self.work_dir = work_dir
        self.stop = stop
        self.watch = watch
        self.outbox = outbox
        # The newest checkpoint, while the API has not taken it: the result needs it.
        self._unsent: Upload | None = None
        # Why a file the job wrote was refused (a link, not a regular file): the run fails.
        self._refused: str | None = None
        self._bounds = job_file_bounds(claim.get("limits") or {})
        self.lease_seconds = float((claim.get("lease") or {}).get("seconds", lease_seconds))
        self.heartbeat_seconds = heartbeat_seconds
        self.run_id: Id = claim["run"]["id"]

    def report(self, kind: ReportKind, **body: Any) -> Report:
        """A final report about this run from this worker."""
        return Report(kind=kind, run_id=self.run_id, worker_id=self.worker_id, body=body)

    def execute(self) -> Report | None:
        """Run the job; the report to deliver, or None if the run was given up (lease lost)."""
        run = self.claim["run"]
        attempt = int(run.get("attempt", 1))
        if not _SAFE_ID.match(str(self.run_id)):  # it becomes a directory name
            raise ValueError(f"unexpected run id {self.run_id!r}")
        attempt_dir = self.work_dir / "runs" / str(self.run_id) / f"attempt-{attempt}"
        shutil.rmtree(attempt_dir, ignore_errors=True)  # leftovers of an agent that died
        ckpt_dir = attempt_dir / "checkpoints"
        ckpt_dir.mkdir(parents=True)
        spec_path = attempt_dir / "spec.json"
        spec_path.write_text(json.dumps(run["spec"], indent=1))
        resume = self._fetch_checkpoint(self.claim.get("checkpoint"), ckpt_dir)
        log.info("run %s attempt %d claimed%s", self.run_id, attempt, " (resuming)" * resume)
        try:
            inputs = fetch_inputs(
                run["spec"],
                client=self.client,
                executor=self.executor,
                work_dir=self.work_dir,
                attempt_dir=attempt_dir,
            )
        except InputUnavailable as exc:  # not served, or not storable here
            log.warning("run %s: %s", self.run_id, exc)
            return self.report(exc.kind, **exc.body)
        dataset_file, code_file, model_file = inputs
        if self.stop.is_set():  # stopped while downloading: do not start a job only to stop it
            return self.report("release", reason="worker shutting down")
        options = self.claim.get("job") or {}
        request = JobRequest(
            run_id=self.run_id,
            attempt_dir=attempt_dir,
            spec_path=spec_path,
            result_path=attempt_dir / "result.json",
            checkpoint_dir=ckpt_dir,
            resume=resume,
            max_model_parameters=(self.claim.get("limits") or {}).get("max_model_parameters"),
            trace_every_steps=options.get("trace_every_steps"),
            until_epoch=options.get("until_epoch"),
            until_step=options.get("until_step"),
            image=run.get("image"),
            environment=claim_environment(self.claim.get("provenance") or {}),
            dataset_file=dataset_file,
            code_file=code_file,
            model_file=model_file,
            max_activation_elements=(self.claim.get("limits") or {}).get("max_activation_elements"),
            # A re-trace or replay of part of a run ends mid-run: no model to take away.
            export_model=None
            if options.get("until_epoch") is not None or options.get("until_step") is not None
            else attempt_dir / MODEL_FILE,
        )
        # Opened before the job starts, so what the agent reads and writes there is reached
        # from this descriptor, whatever the job makes of the names inside.
        with JobWorkspace(attempt_dir) as workspace, workspace.create_log("job.log") as job_log:
            started = time.monotonic()
            job = Job(self.run_id, self.executor.start(request))
            try:
                return self._follow(job, request, workspace, job_log, started)
            finally:
                job.handle.close()
                shutil.rmtree(ckpt_dir, ignore_errors=True)  # uploaded, or superseded

    def _follow(
        self,
        job: Job,
        request: JobRequest,
        workspace: JobWorkspace,
        job_log: IO[str],
        started: float,
    ) -> Report | None:
        stops = self.watch(job)
        if stops:  # asked to stop while the job was being started
            job.handle.send_signal(signal.SIGKILL if stops > 1 else signal.SIGTERM)
        uploads: queue.Queue[Upload | None] = queue.Queue()
        uploader = threading.Thread(
            target=self._upload_loop, args=(job, workspace, uploads), daemon=True
        )
        beater = threading.Thread(target=self._heartbeat_loop, args=(job,), daemon=True)
        uploader.start()
        beater.start()
        try:
            tail = StderrTail()
            try:
                self._read_output(job, request, tail, uploads, job_log)
                code = job.handle.wait()
            except BaseException:
                job.handle.send_signal(signal.SIGKILL)
                job.handle.wait()
                raise
            finally:
                job.ended.set()
                self.watch(None)
                uploads.put(None)
                uploader.join()  # every checkpoint is in before the run is reported
            seconds = time.monotonic() - started
            return self._final_report(job, code, request, workspace, tail, seconds)
        finally:
            # Heartbeats go on until here (uploads can outlast the job); from here on the
            # courier keeps the lease while the report waits.
            job.reported.set()
            beater.join()

    def _fetch_checkpoint(self, offer: dict[str, Any] | None, directory: Path) -> bool:
        if not offer:
            return False
        try:
            for entry in checkpoint_downloads(offer["files"]):
                name, digest = str(entry["name"]), str(entry["sha256"])
                self.client.download_artifact(entry["artifact_id"], directory / name, sha256=digest)
        except (ApiError, OSError, ValueError, KeyError, TypeError) as exc:
            # Training from the start gives the same bits as resuming, only later.
            log.warning("run %s: offered checkpoint unusable (%s); starting over", self.run_id, exc)
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            return False
        return True

    def _read_output(
        self,
        job: Job,
        request: JobRequest,
        tail: StderrTail,
        uploads: queue.Queue[Upload | None],
        job_log: IO[str],
    ) -> None:
        for line in job.handle.stderr_lines():
            event = parse_line(line)
            if event is None:
                tail.add(line)
                job_log.write(line + "\n")
                continue
            job.progress = event
            if event["event"] == "checkpoint" and not job.abandoned.is_set():
                try:
                    uploads.put(checkpoint_uploads(request.checkpoint_dir, event))
                except ValueError as exc:
                    log.warning("run %s: %s", job.run_id, exc)

    def _upload_loop(
        self, job: Job, workspace: JobWorkspace, uploads: queue.Queue[Upload | None]
    ) -> None:
        while (item := uploads.get()) is not None:
            epoch, *paths = item
            what = f"checkpoint {paths[-1].stem}"
            if job.abandoned.is_set() or self._refused is not None:
                continue
            try:
                for path in paths:  # npz first: the API counts a checkpoint once its json is in
                    with workspace.open_file(path, max_bytes=self._bounds.artifact) as opened:
                        self.client.upload_artifact(
                            job.run_id,
                            self.worker_id,
                            opened,
                            kind="checkpoint",
                            name=path.name,
                            epoch=epoch,
                        )
                log.debug("run %s: %s uploaded", job.run_id, what)
                if epoch is not None:
                    self._unsent = None
            except UnsafeJobFile as exc:
                self._refuse(job, f"{what} not uploaded: {exc}")
            except LeaseLost as exc:
                job.abandon(f"lease lost while uploading ({exc.detail})")
            except (ApiError, OSError) as exc:  # a later resume starts from an older checkpoint
                log.warning("run %s: %s not uploaded: %s", job.run_id, what, exc)
                # Only an epoch-end checkpoint can be the final one the result needs.
                if isinstance(exc, ApiError) and exc.retryable and epoch is not None:
                    self._unsent = item

    def _heartbeat_loop(self, job: Job) -> None:
        # Heartbeats keep the lease every `heartbeat_seconds`; new progress goes out sooner
        # (at most once a second) so progress bars and event streams stay live.
        deadline = time.monotonic() + self.lease_seconds
        due = time.monotonic() + self.heartbeat_seconds
        sent_progress: dict[str, Any] | None = None
        while not job.reported.wait(PROGRESS_SECONDS) and not job.abandoned.is_set():
            mark_alive(self.work_dir)  # a long job is progress too (the liveness probe)
            progress = job.progress
            if time.monotonic() < due and progress is sent_progress:
                continue
            sent = time.monotonic()
            try:
                self.client.heartbeat(job.run_id, self.worker_id, progress)
            except LeaseLost as exc:
                job.abandon(f"lease lost ({exc.detail})")
                return
            except ApiError as exc:
                if not exc.retryable:
                    job.abandon(f"heartbeat refused: {exc}")
                    return
                # Once the job has ended its result is worth keeping whatever the lease:
                # the server says whether it still takes it.
                if time.monotonic() >= deadline and not job.ended.is_set():
                    job.abandon(f"lease expired while the API was unreachable ({exc})")
                    return
                log.warning("run %s: heartbeat failed (%s); retrying", job.run_id, exc)
                continue
            except Exception:  # never let a bug end the heartbeats silently
                log.exception("run %s: heartbeat thread error", job.run_id)
                continue
            deadline, due, sent_progress = (
                sent + self.lease_seconds,
                sent + self.heartbeat_seconds,
                progress,
            )

    def _refuse(self, job: Job, why: str) -> None:
        """Fail the run for a file its job wrote that the agent will not read; stop the job."""
        log.error("run %s: %s", job.run_id, why)
        if self._refused is None:
            self._refused = why
        if not job.ended.is_set():
            job.handle.send_signal(signal.SIGKILL)

    def _final_report(
        self,
        job: Job,
        code: int,
        request: JobRequest,
        workspace: JobWorkspace,
        tail: StderrTail,
        seconds: float,
    ) -> Report | None:
        if job.abandoned.is_set():
            return None
        if self._refused is not None:
            return self.report("fail", error={"type": "UnsafeJobFile", "message": self._refused})
        try:
            # Read once the job has ended: the executor's wait() has ended every process of
            # the job by then (a container's, or the process job's group and strays), so
            # nothing but the job wrote this file, and nothing changes it while it is read.
            raw = workspace.read_bytes(request.result_path, max_bytes=self._bounds.result)
            result = JobResult.model_validate(json.loads(raw))
        except (OSError, ValueError) as exc:
            if self.stop.is_set():  # we stopped it before it could write a result
                return self.report("release", reason="worker shutting down")
            how = describe_exit(code)
            if job.handle.failure_reason:
                how += f" ({job.handle.failure_reason})"
            log.info("run %s crashed: %s, no result document", self.run_id, how)
            return self.report(
                "fail",
                error={
                    "type": "JobCrashed",
                    "message": f"the job ended with {how} "
                    f"without a readable result document ({exc})",
                    "traceback": tail.text(),
                },
            )
        log.info("run %s %s after %.1f s", self.run_id, result.status, seconds)
        if result.status == "interrupted":
            reason = "worker shutting down" if self.stop.is_set() else "job interrupted"
            return self.report("release", reason=reason)
        try:
            uploads = self._keep_unsent(workspace)
            if result.status == "succeeded":
                uploads += self._keep_model(request, workspace)
        except UnsafeJobFile as exc:
            self._refuse(job, str(exc))
            return self.report("fail", error={"type": "UnsafeJobFile", "message": str(exc)})
        return self.report("complete", result=result.model_dump(mode="json"), uploads=uploads)

    def _keep_model(self, request: JobRequest, workspace: JobWorkspace) -> list[dict[str, Any]]:
        """Move the exported model to the outbox, to upload (kind "model") before the result."""
        model = request.export_model
        if model is None:
            return []
        keep = self.outbox.files_dir(self.run_id)
        keep.mkdir(mode=0o700, parents=True, exist_ok=True)
        if workspace.move_out(model, keep) is None:  # the job exported none
            return []
        return [{"file": model.name, "kind": "model"}]

    def _keep_unsent(self, workspace: JobWorkspace) -> list[dict[str, Any]]:
        """Move the final checkpoint the API has not taken to the outbox, to send later."""
        if self._unsent is None:
            return []
        epoch, *paths = self._unsent
        assert epoch is not None  # step checkpoints are never kept for the result
        keep = self.outbox.files_dir(self.run_id)
        keep.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path in paths:  # same file system: a rename, not a copy
            if workspace.move_out(path, keep) is None:
                raise FileNotFoundError(f"checkpoint file {path.name} is gone")
        log.info(
            "run %s: checkpoint of epoch %d kept to upload with the result", self.run_id, epoch
        )
        return [{"file": path.name, "epoch": epoch} for path in paths]
