"""One claimed run on this node: lay out its workspace, start its job, follow it, report.

The agent's own thread reads the job's stderr; beside it a heartbeat thread keeps the lease
and an upload thread sends checkpoints in the order the job wrote them, so a slow upload
never stalls training on a full stderr pipe. The final report goes through the outbox.

An API that does not answer never stops the job: heartbeats and uploads are tried again
with backoff, and the next one to get through renews the lease (or takes the run back, if
the server requeued it and nobody else has claimed it since). Checkpoints not taken by the
time the job ends wait in the outbox with the report. Only a definite answer that the run
is no longer this worker's (409, 403, a cancelled run) gives the job up.
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
    LogBuffer,
    StderrTail,
    Upload,
    checkpoint_downloads,
    checkpoint_uploads,
    describe_exit,
    job_file_bounds,
)
from worker.node.job_record import JobRecord, forget_record, keep_record
from worker.node.job_workspace import FileTooLarge, JobWorkspace, UnsafeJobFile
from worker.node.liveness import mark_alive
from worker.node.reports import Outbox, Report, ReportKind
from worker.node.run_inputs import InputUnavailable, fetch_inputs
from worker.record.environment_capture import claim_environment
from worker.result import JobResult
from worker.training.cluster import gang_environment
from worker.training.progress import parse_line

log = logging.getLogger("reprotrain.agent")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
TICK_SECONDS = 1.0  # how often the heartbeat thread looks (liveness, due sends, retries)
RETRY_SECONDS = 30.0  # the longest wait between tries while the API does not answer
MODEL_FILE = "model.keras"  # the final model a succeeded job exports, uploaded as kind "model"


class Job:
    """A claimed run's job and the state the agent's threads share about it."""

    def __init__(self, run_id: Id, handle: JobHandle) -> None:
        self.run_id = run_id
        self.handle = handle
        self.progress: dict[str, Any] | None = None
        self.log = LogBuffer()  # its output lines, for the heartbeats to send
        # The end of an epoch (its metrics) not sent yet: it goes out at the next tick.
        self.milestone: dict[str, Any] | None = None
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
        heartbeat_seconds: float,
        progress_seconds: float = TICK_SECONDS,
    ) -> None:
        self.claim = claim
        self.client = client
        self.executor = executor
        self.worker_id = worker_id
        self.work_dir = work_dir
        self.stop = stop
        self.watch = watch
        self.outbox = outbox
        # Checkpoints the API had not taken when the job ended: they go with the report.
        self._waiting: list[Upload] = []
        # Why a file the job wrote was refused (a link, not a regular file): the run fails.
        self._refused: str | None = None
        self._bounds = job_file_bounds(claim.get("limits") or {})
        self.heartbeat_seconds = heartbeat_seconds
        self.progress_seconds = progress_seconds
        # While the API does not answer, heartbeats and uploads are tried at least this often.
        self._retry_cap = min(max(heartbeat_seconds, TICK_SECONDS), RETRY_SECONDS)
        self.run_id: Id = claim["run"]["id"]
        # Every report about the run names the attempt: one that is over is refused.
        self.attempt = int(claim["run"].get("attempt", 1))
        # A member of a multi-host run's gang: {"rank", "cluster"} (rank 0 reports the run).
        self.gang: dict[str, Any] | None = claim.get("gang")
        self.rank = int(self.gang["rank"]) if self.gang else 0

    def report(self, kind: ReportKind, **body: Any) -> Report:
        """A final report about this run from this worker."""
        return Report(kind, self.run_id, self.worker_id, body, attempt=self.attempt)

    def execute(self) -> Report | None:
        """Run the job; the report to deliver, or None if the run was given up (lease lost)."""
        run = self.claim["run"]
        attempt = self.attempt
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
            environment={
                **claim_environment(self.claim.get("provenance") or {}),
                **gang_environment(self.gang),
            },
            dataset_file=dataset_file,
            code_file=code_file,
            model_file=model_file,
            max_activation_elements=(self.claim.get("limits") or {}).get("max_activation_elements"),
            # A re-trace or replay of part of a run ends mid-run: no model to take away; and
            # of a gang, rank 0's is the run's.
            export_model=None
            if options.get("until_epoch") is not None
            or options.get("until_step") is not None
            or self.rank > 0
            else attempt_dir / MODEL_FILE,
        )
        record = JobRecord(
            run_id=self.run_id,
            attempt=attempt,
            worker_id=self.worker_id,
            limits=dict(self.claim.get("limits") or {}),
            export_model=request.export_model is not None,
        )
        keep_record(attempt_dir, record)  # before the job starts: a job has a record
        return self._run(request, lambda: self.executor.start(request))

    def adopt(self, follow: Callable[[Path], JobHandle], *, export_model: bool) -> Report | None:
        """Follow the job an earlier agent on this work directory started for this claim
        (`follow(result_path)` gives its handle) to its report, as if it had started it."""
        attempt_dir = self.work_dir / "runs" / str(self.run_id) / f"attempt-{self.attempt}"
        request = JobRequest(
            run_id=self.run_id,
            attempt_dir=attempt_dir,
            spec_path=attempt_dir / "spec.json",
            result_path=attempt_dir / "result.json",
            checkpoint_dir=attempt_dir / "checkpoints",
            # How the job was started: read by no one once it runs.
            resume=False,
            max_model_parameters=None,
            trace_every_steps=None,
            until_epoch=None,
            image=None,
            export_model=attempt_dir / MODEL_FILE if export_model else None,
        )
        return self._run(request, lambda: follow(request.result_path), adopted=True)

    def _run(
        self, request: JobRequest, start: Callable[[], JobHandle], *, adopted: bool = False
    ) -> Report | None:
        # Opened before the job starts, so what the agent reads and writes there is reached
        # from this descriptor, whatever the job makes of the names inside. An adopted job's
        # output is read again from its start: its log is written anew.
        try:
            with (
                JobWorkspace(request.attempt_dir) as workspace,
                workspace.create_log("job.log", replace=adopted) as job_log,
            ):
                started = time.monotonic()
                job = Job(self.run_id, start())
                try:
                    return self._follow(job, request, workspace, job_log, started)
                finally:
                    job.handle.close()
                    # Its checkpoints are uploaded, or superseded.
                    shutil.rmtree(request.checkpoint_dir, ignore_errors=True)
        finally:
            forget_record(request.attempt_dir)  # ended, or never started: nothing to adopt

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
            self._send_log_end(job)
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
                job.log.add(line)
                continue
            job.progress = event
            if event["event"] == "epoch_end":
                job.milestone = event
            if event["event"] == "checkpoint" and not job.abandoned.is_set():
                try:
                    uploads.put(checkpoint_uploads(request.checkpoint_dir, event))
                except ValueError as exc:
                    log.warning("run %s: %s", job.run_id, exc)

    def _upload_loop(
        self, job: Job, workspace: JobWorkspace, uploads: queue.Queue[Upload | None]
    ) -> None:
        while (item := uploads.get()) is not None:
            if job.abandoned.is_set() or self._refused is not None:
                continue
            if self._waiting:  # the API was away when the job ended: the rest waits as well
                self._waiting.append(item)
                continue
            self._upload(job, workspace, item)

    def _upload(self, job: Job, workspace: JobWorkspace, item: Upload) -> None:
        """Upload one checkpoint, trying again while the API does not answer and the job
        runs; once the job has ended it waits for the report instead."""
        epoch, *paths = item
        what = f"checkpoint {paths[-1].stem}"
        delay = TICK_SECONDS
        while True:
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
                            attempt=self.attempt,
                        )
                log.debug("run %s: %s uploaded", job.run_id, what)
                return
            except UnsafeJobFile as exc:
                self._refuse(job, f"{what} not uploaded: {exc}")
                return
            except LeaseLost as exc:
                job.abandon(f"lease lost while uploading ({exc.detail})")
                return
            except (ApiError, OSError) as exc:
                if not (isinstance(exc, ApiError) and exc.retryable) or job.abandoned.is_set():
                    # Refused for good: a later resume starts from an older checkpoint.
                    log.warning("run %s: %s not uploaded: %s", job.run_id, what, exc)
                    return
                if job.ended.is_set():
                    log.warning(
                        "run %s: %s not uploaded (%s); it waits in the outbox with the report",
                        job.run_id,
                        what,
                        exc,
                    )
                    self._waiting.append(item)
                    return
                # Said once per checkpoint; the heartbeats say when the API answers again.
                (log.warning if delay == TICK_SECONDS else log.debug)(
                    "run %s: %s not uploaded (%s); trying again in %.0f s",
                    job.run_id,
                    what,
                    exc,
                    delay,
                )
                job.ended.wait(delay)  # at once when the job ends: then it goes to the outbox
                delay = min(delay * 2, self._retry_cap)

    def _heartbeat_loop(self, job: Job) -> None:
        # Heartbeats keep the lease every `heartbeat_seconds`; new progress goes out sooner,
        # but at most once a `progress_seconds` (the server's setting: a fleet's heartbeats
        # are what the API serves most), except the end of an epoch, with its metrics, which
        # goes out at the next tick. While the API does not answer, the job trains on and
        # heartbeats are tried with backoff.
        due = time.monotonic() + self.heartbeat_seconds
        progress_due = time.monotonic()  # the first progress at once: training has started
        sent_progress: dict[str, Any] | None = None
        away_since: float | None = None  # when the API stopped answering
        retry_at = 0.0
        while not job.reported.wait(TICK_SECONDS) and not job.abandoned.is_set():
            mark_alive(self.work_dir)  # a long job is progress too (the liveness probe)
            now = time.monotonic()
            milestone = job.milestone
            progress = milestone if milestone is not None else job.progress
            if away_since is not None and now < retry_at:
                continue
            piece = job.log.take() if self.attempt is not None else None
            if (
                away_since is None
                and now < due
                and milestone is None
                and ((progress is sent_progress and piece is None) or now < progress_due)
            ):
                continue
            try:
                self.client.heartbeat(
                    job.run_id, self.worker_id, progress, attempt=self.attempt, log=piece
                )
                if piece is not None:
                    job.log.taken(piece)
            except LeaseLost as exc:
                job.abandon(f"lease lost ({exc.detail})")
                return
            except ApiError as exc:
                if piece is not None and exc.status_code == 422:
                    # An API older than this agent takes no log: the run goes on without it.
                    log.warning("run %s: the API refused the job's log (%s); sending none",
                                job.run_id, exc)  # fmt: skip
                    job.log.refuse()
                    continue
                if not exc.retryable:
                    job.abandon(f"heartbeat refused: {exc}")
                    return
                if away_since is None:
                    away_since = now
                    log.warning(
                        "run %s: the API does not answer (%s); training goes on and the "
                        "lease is renewed when it answers again",
                        job.run_id,
                        exc,
                    )
                # Sooner at first (a restart is short), then once a heartbeat period.
                retry_at = now + min(max(now - away_since, TICK_SECONDS), self._retry_cap)
                continue
            except Exception:  # never let a bug end the heartbeats silently
                log.exception("run %s: heartbeat thread error", job.run_id)
                continue
            if away_since is not None:
                log.info(
                    "run %s: the API answers again after %.0f s; the run is still held",
                    job.run_id,
                    now - away_since,
                )
                away_since = None
            due, sent_progress = now + self.heartbeat_seconds, progress
            if milestone is not None and job.milestone is milestone:
                job.milestone = None
            progress_due = now + self.progress_seconds

    def _send_log_end(self, job: Job, pieces: int = 32) -> None:
        """Send the log's last lines before the report (heartbeats may not come again): the
        run page then shows how the job ended. What the API does not take stays in the
        worker's job.log."""
        if self.attempt is None or job.abandoned.is_set():
            return
        for _ in range(pieces):
            piece = job.log.take()
            if piece is None:
                return
            try:
                self.client.heartbeat(
                    job.run_id, self.worker_id, None, attempt=self.attempt, log=piece
                )
            except ApiError as exc:  # LeaseLost too: the report finds out what to do
                log.info("run %s: the log's last lines were not sent (%s)", job.run_id, exc)
                return
            job.log.taken(piece)

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
        except FileTooLarge as exc:  # more than the API takes: kept, and the run says why
            return self._result_too_large(workspace, request, exc)
        except (OSError, ValueError) as exc:
            if self.stop.is_set():  # we stopped it before it could write a result
                return self.report("release", reason="worker shutting down")
            how = describe_exit(code)
            if job.handle.failure_reason:
                how += f" ({job.handle.failure_reason})"
            log.info("run %s crashed: %s, no result document", self.run_id, how)
            if self.gang is not None:  # a lost member: the run waits for a new gang
                return self.report("release", reason=f"gang member {self.rank} ended: {how}")
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
        if self.gang is not None:
            ended = self._gang_report(result)
            if ended is not None or self.rank > 0:
                return ended
        try:
            uploads = self._keep_waiting(workspace)
            if result.status == "interrupted":  # its checkpoints are where the next resumes
                reason = "worker shutting down" if self.stop.is_set() else "job interrupted"
                return self.report("release", reason=reason, uploads=uploads)
            if result.status == "succeeded":
                uploads += self._keep_model(request, workspace)
        except UnsafeJobFile as exc:
            self._refuse(job, str(exc))
            return self.report("fail", error={"type": "UnsafeJobFile", "message": str(exc)})
        return self.report("complete", result=result.model_dump(mode="json"), uploads=uploads)

    def _gang_report(self, result: JobResult) -> Report | None:
        """What a gang member reports of its job's end: a lost member is no failure of the
        run (it waits for a new gang, which resumes from rank 0's checkpoint); of the rest
        rank 0 reports as any holder (None here), and another member only says it is done."""
        error = result.error
        if result.status == "failed" and error is not None and error.type == "ClusterError":
            return self.report("release", reason=f"the gang lost a member: {error.message}")
        if self.rank == 0:
            return None
        if result.status == "succeeded":
            try:
                self.client.gang_done(self.run_id, self.worker_id, attempt=self.attempt)
            except ApiError as exc:  # the run ended meanwhile: nothing more to say
                log.info("run %s: member end not taken (%s)", self.run_id, exc)
            return None
        if result.status == "interrupted":
            return self.report("release", reason="a gang member was stopped")
        message = error.message if error is not None else "no error recorded"
        return self.report("release", reason=f"gang member {self.rank} failed: {message}")

    def _result_too_large(
        self, workspace: JobWorkspace, request: JobRequest, exc: FileTooLarge
    ) -> Report:
        """The failure report for a result document past the API's bound; the document is
        moved, unread, to the outbox's `refused/` directory."""
        refused = self.outbox.directory / "refused"
        refused.mkdir(mode=0o700, parents=True, exist_ok=True)
        moved = workspace.move_out(request.result_path, refused)
        kept = refused / f"run-{self.run_id}.result.json"
        if moved is not None:
            moved.rename(kept)
        log.error("run %s: result of %d bytes kept in %s", self.run_id, exc.size, kept)
        message = (
            f"the job's result document is too large for the API: {exc.size} bytes, more "
            f"than the {exc.max_bytes} it takes (REPRO_MAX_RESULT_BYTES); the worker kept "
            f"it in {kept}"
        )
        error = {"type": "ResultTooLarge", "message": message, "result_bytes": exc.size}
        return self.report("fail", error=error)

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

    def _keep_waiting(self, workspace: JobWorkspace) -> list[dict[str, Any]]:
        """Move the checkpoints the API has not taken to the outbox, to upload before the
        report (in the order the job wrote them)."""
        if not self._waiting:
            return []
        keep = self.outbox.files_dir(self.run_id)
        keep.mkdir(mode=0o700, parents=True, exist_ok=True)
        kept: list[dict[str, Any]] = []
        for epoch, *paths in self._waiting:
            for path in paths:  # same file system: a rename, not a copy
                if workspace.move_out(path, keep) is None:
                    raise FileNotFoundError(f"checkpoint file {path.name} is gone")
                kept.append({"file": path.name, "epoch": epoch})
        log.info(
            "run %s: %d checkpoint(s) kept to upload with the report", self.run_id, len(kept) // 2
        )
        return kept
