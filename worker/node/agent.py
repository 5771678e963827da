"""The worker agent (`repro worker`): registers, claims runs one at a time, runs each job
through an executor and delivers its report; stops gracefully on SIGTERM/SIGINT."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import signal
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from worker.node.adoption import AdoptingExecutor, NotAdoptable, OrphanedJob, adoptable, still_held
from worker.node.client import ApiClient, ApiError, ApiUnreachable, Id
from worker.node.enrollment import worker_credential
from worker.node.executors import Executor, make_executor
from worker.node.gang import gang_claim
from worker.node.job import ClaimedRun, Job
from worker.node.liveness import mark_alive
from worker.node.readiness_probe import agent_flags
from worker.node.registration import registration
from worker.node.reports import MAX_BACKOFF, Courier, Outbox, Report

log = logging.getLogger("reprotrain.agent")
CLAIM_WAIT_SECONDS = 20.0  # how long an idle worker's claim waits on the server (long poll)
_LOCK_FILE = ".agent.lock"


class WorkDirBusy(Exception):
    """Another agent holds this work directory."""


class Agent:
    """Claims runs from the API one at a time and runs each through its executor."""

    def __init__(
        self,
        client: ApiClient,
        *,
        name: str,
        work_dir: Path,
        executor: Executor | None = None,
        poll_interval: float = 1.0,
        claim_wait: float = CLAIM_WAIT_SECONDS,
        images: Sequence[str] = (),
        max_jobs: int | None = None,
        cpu_replicas: int | None = None,
        readiness_checks: bool = True,
        gang_host: str | None = None,
    ) -> None:
        self.client = client
        # Where this worker's jobs listen for a gang's collectives; None: it joins no gang.
        self.gang_host = gang_host
        self.readiness_checks = readiness_checks
        self.name = name
        self.work_dir = Path(work_dir)
        self.executor = executor or make_executor("process")
        self.poll_interval = poll_interval
        # A worker that joins gangs asks for work without long polls: between two tries it
        # would not be seen as ready for a gang.
        self.claim_wait = 0.0 if gang_host is not None else claim_wait
        self.images = list(images)
        self.max_jobs = max_jobs
        # Logical CPU devices a job may split the CPU into when the node has no GPU.
        self.cpu_replicas = cpu_replicas or default_cpu_replicas()
        self.worker_id: Id | None = None
        self.heartbeat_seconds = 10.0
        self.progress_seconds = 5.0
        self._stop = threading.Event()
        # Reentrant: request_stop may run in a signal handler that interrupted a holder.
        self._lock = threading.RLock()
        self._stops = 0
        self._job: Job | None = None
        self._claim_delay = poll_interval
        self.courier = Courier(client, Outbox(self.work_dir / "outbox"), stop=self._stop)

    # -- stopping ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop gracefully: the job checkpoints after its current steps; a second call kills it."""
        with self._lock:
            self._stops += 1
            force = self._stops > 1
            job = self._job
            self._stop.set()
        if job is not None:
            log.info("stop requested: %s", "killing the job" if force else "checkpointing the job")
            job.handle.send_signal(signal.SIGKILL if force else signal.SIGTERM)

    def install_signal_handlers(self) -> None:
        """Make SIGTERM and SIGINT request a stop (call from the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signal handlers can only be installed from the main thread")
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.request_stop())

    def _watch(self, job: Job | None) -> int:
        with self._lock:
            self._job = job
            return self._stops

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        """Register, send reports left from before, follow the jobs an earlier agent left
        running, then claim and run jobs until stopped or `max_jobs` jobs are done."""
        with _work_dir_lock(self.work_dir):
            if not isinstance(self.executor, AdoptingExecutor):
                self.executor.reap_orphans()  # an adopting executor's wait for adoption, below
            if not self._register():
                return
            if self.readiness_checks:
                # Beside claiming: the checks import TensorFlow, which takes seconds.
                threading.Thread(
                    target=self._report_readiness, name="readiness", daemon=True
                ).start()
            # Before claiming: a claim may requeue runs whose lease ran out, ours among them.
            self.courier.deliver_pending()
            if isinstance(self.executor, AdoptingExecutor):
                self._adopt(self.executor.orphaned_jobs())
            try:
                done = self._claim_loop()
            finally:  # the next job's interpreter goes with the agent
                self._executor_call("discard_warm")
            log.info("worker %s stopping after %d job(s)", self.worker_id, done)

    def _claim_loop(self) -> int:
        done = 0
        while not self._stop.is_set() and (self.max_jobs is None or done < self.max_jobs):
            mark_alive(self.work_dir)
            # While idle, the next job's interpreter starts (process executor, warm starts).
            self._executor_call("prepare")
            asked = time.monotonic()
            claim = self._join_gang() if self.gang_host is not None else None
            if claim is None:
                claim = self._claim()
            if claim is None:
                # A server that held the claim has waited already; one that answered at
                # once (no long polls, or an error) is asked again after the poll interval.
                if self.claim_wait <= 0 or time.monotonic() - asked < self.claim_wait / 2:
                    self._stop.wait(self.poll_interval)
                continue
            self._process(claim)
            done += 1
        return done

    def _adopt(self, orphans: Sequence[OrphanedJob]) -> None:
        """Follow each job an earlier agent on this work directory left to its report, as
        if this agent had started it; remove those it may not follow."""
        for orphan in sorted(orphans, key=lambda o: not o.ended):  # ended ones report at once
            if self._stop.is_set():
                return  # the rest stay for the next start
            self._adopt_one(orphan)

    def _adopt_one(self, orphan: OrphanedJob) -> None:
        try:
            record = adoptable(orphan, work_dir=self.work_dir, worker_id=self._wid)
            still_held(self.client, record)
        except NotAdoptable as exc:
            orphan.remove(str(exc))
            return
        log.info(
            "adopting %s (%s) of run %s, attempt %d, left by an earlier agent",
            orphan.describe(),
            orphan.state,
            record.run_id,
            record.attempt,
        )
        run = self._claimed_run(record.claim())

        def follow() -> Report | None:
            try:
                return run.adopt(orphan.follow, export_model=record.export_model)
            except BaseException:
                orphan.remove("the agent failed while adopting it")  # if it is still there
                raise

        self._carry(run, follow)

    def _executor_call(self, name: str) -> None:
        # Optional executor hooks: only the process executor keeps a warm interpreter.
        hook = getattr(self.executor, name, None)
        if hook is None:
            return
        try:
            hook()
        except OSError as exc:  # e.g. out of processes: the next job starts cold
            log.warning("executor %s failed: %s", name, exc)

    def _registration(self) -> dict[str, Any]:
        return registration(self.executor, images=self.images, cpu_replicas=self.cpu_replicas)

    def _report_readiness(self) -> None:
        """Run the reproducibility checks where jobs run and register again with their flags
        (a registration refreshes the same worker), so `GET /workers` shows them."""
        flags = agent_flags(self.executor)
        if flags is None or self._stop.is_set():
            return
        try:
            self.client.register(self.name, **self._registration(), readiness_flags=flags)
        except (ApiError, ApiUnreachable) as exc:
            log.warning("could not report the reproducibility checks' flags (%s)", exc)
            return
        log.info("reported %d reproducibility flag(s)", len(flags))

    def _register(self) -> bool:
        registration = self._registration()
        delay = self.poll_interval
        while not self._stop.is_set():
            try:
                info = self.client.register(self.name, **registration)
            except ApiError as exc:
                if not exc.retryable:
                    raise
                wait = exc.retry_after if exc.retry_after is not None else delay
                log.warning("cannot register (%s); retrying in %.1f s", exc, wait)
                self._stop.wait(wait)
                delay = min(delay * 2, MAX_BACKOFF)
                continue
            self.worker_id = info["id"]
            self.heartbeat_seconds = float(info["heartbeat_seconds"])
            # A server that predates the setting sent progress once a second.
            self.progress_seconds = float(info.get("progress_seconds", 1.0))
            self.courier.heartbeat_seconds = self.heartbeat_seconds
            self.client.presigned_uploads = bool(info.get("presigned_uploads"))
            log.info(
                "registered as worker %s (%s), %d device(s) for replicas%s",
                self.worker_id,
                self.name,
                int(info.get("devices", 1)),
                "; files go to the object store by presigned URL"
                if self.client.presigned_uploads
                else "",
            )
            return True
        return False

    def _join_gang(self) -> dict[str, Any] | None:
        assert self.gang_host is not None
        return self._claim(
            lambda: gang_claim(
                self.client,
                self._wid,
                host=self.gang_host or "",
                stop=self._stop,
                poll_interval=self.poll_interval,
                waiting=lambda: mark_alive(self.work_dir),
            )
        )

    def _claim(
        self, ask: Callable[[], dict[str, Any] | None] | None = None
    ) -> dict[str, Any] | None:
        try:
            claim = (ask or self._ask_for_run)()
            self._claim_delay = self.poll_interval
            return claim
        except ApiError as exc:
            if exc.status_code == 404:  # e.g. a fresh API database: introduce ourselves again
                log.warning("the API does not know worker %s; registering again", self.worker_id)
                self._register()
            elif not exc.retryable:
                raise
            else:  # back off, so an API outage costs neither it nor the log much
                wait = exc.retry_after if exc.retry_after is not None else self._claim_delay
                log.warning("claim failed (%s); next try in %.1f s", exc, wait)
                self._stop.wait(wait)
                self._claim_delay = min(self._claim_delay * 2, MAX_BACKOFF)
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
        run = self._claimed_run(claim)
        self._carry(run, run.execute)

    def _claimed_run(self, claim: dict[str, Any]) -> ClaimedRun:
        return ClaimedRun(
            claim,
            client=self.client,
            executor=self.executor,
            worker_id=self._wid,
            work_dir=self.work_dir,
            stop=self._stop,
            watch=self._watch,
            outbox=self.courier.outbox,
            heartbeat_seconds=self.heartbeat_seconds,
            progress_seconds=self.progress_seconds,
        )

    def _carry(self, run: ClaimedRun, execute: Callable[[], Report | None]) -> None:
        """Run the job to its report and deliver it."""
        try:
            report = execute()
        except Exception as exc:  # the agent's own failure around this run: report, go on
            log.exception("run %s: the agent failed around the job", run.run_id)
            tb = traceback.format_exc()
            report = run.report(
                "fail", error={"type": type(exc).__name__, "message": str(exc), "traceback": tb}
            )
        if report is not None:
            self.courier.deliver(report)


@contextlib.contextmanager
def _work_dir_lock(work_dir: Path) -> Iterator[None]:
    """Hold the work directory for this agent alone: its outbox and job files are its own."""
    work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(work_dir / _LOCK_FILE, "a") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkDirBusy(
                f"another worker agent is using {work_dir}; give each agent its own --work-dir"
            ) from None
        yield  # the lock goes with the file (or the process)


def default_cpu_replicas() -> int:
    """Logical CPU devices a CPU-only worker allows by default: one per core."""
    return max(os.cpu_count() or 1, 1)


def default_work_dir() -> Path:
    """A work directory that outlives the agent, so a restart sends what it left undelivered."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "reprotrain" / "worker"


def run_agent(
    api: str,
    token: str | None,
    *,
    name: str | None = None,
    work_dir: Path | None = None,
    executor: str = "process",
    executor_options: dict[str, Any] | None = None,
    poll_interval: float = 1.0,
    claim_wait: float = CLAIM_WAIT_SECONDS,
    max_jobs: int | None = None,
    images: list[str] | None = None,
    install_signals: bool = True,
    cpu_replicas: int | None = None,
    readiness_checks: bool = True,
    enroll: bool = False,
    gang_host: str | None = None,
) -> None:
    """Run a worker agent against the API at `api` until it is stopped.

    With `enroll`, `token` is the fleet's bootstrap token: the agent works with a credential
    of its own, enrolled once and kept in the work directory (worker.node.enrollment)."""
    if enroll:
        work_dir = work_dir or default_work_dir()
        name, token = worker_credential(api, token, work_dir, name)
    with ApiClient(api, token) as client, contextlib.ExitStack() as stack:
        if work_dir is None:
            work_dir = default_work_dir()
            try:
                work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:  # e.g. a read-only home in a container
                work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="repro-")))
                log.warning(
                    "no persistent work directory (%s): using %s, so a report the API has "
                    "not taken when the agent exits is lost; pass --work-dir",
                    exc,
                    work_dir,
                )
        agent = Agent(
            client,
            name=name or f"{socket.gethostname()}-{os.getpid()}",
            work_dir=work_dir,
            executor=make_executor(executor, **(executor_options or {})),
            poll_interval=poll_interval,
            claim_wait=claim_wait,
            images=images or [],
            max_jobs=max_jobs,
            cpu_replicas=cpu_replicas,
            readiness_checks=readiness_checks,
            gang_host=gang_host,
        )
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous = signal.getsignal(sig)
                stack.callback(signal.signal, sig, signal.SIG_DFL if previous is None else previous)
            agent.install_signal_handlers()
        agent.run()
