"""A worker never loses a finished result: final reports wait on local disk until taken.

A report (complete, fail or release) is first written to the outbox in the agent's work
directory, atomically and durably, and only then sent. A result is verified by the API
against the final checkpoint, so a final checkpoint the API has not taken yet waits beside
the report and is uploaded before it. It leaves the outbox when the API
accepts it, or refuses it for good (the lease is gone, the run is gone); on 429, a 5xx or
a dropped connection it stays and is sent again with backoff, also by the next agent
started on the same work directory. A result the API refuses as too large (413) is set
aside in the outbox's `refused/` directory and the run is reported failed with
`ResultTooLarge`, so the run says why instead of ending on an expired lease.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from worker.node.client import ApiClient, ApiError, Id, LeaseLost
from worker.node.job_workspace import UnsafeJobFile
from worker.record.durable import fsync_path, replace_durably

log = logging.getLogger("reprotrain.agent")

ReportKind = Literal["complete", "fail", "release"]
Outcome = Literal["accepted", "refused", "kept"]
MAX_BACKOFF = 30.0  # seconds between attempts while the API cannot take a report
# Answers after which sending the same report again cannot succeed: the lease or the run is
# gone, or the report itself is unacceptable. Anything else (401 included: a token can be
# fixed by an operator) keeps the report.
_REFUSALS = frozenset({400, 403, 404, 409, 410, 413, 422})
_ENTRY = re.compile(r"^run-([A-Za-z0-9_-]{1,100})\.json$")
_TOO_LARGE = 413
# A failure report the API refused as too large is sent again with its traceback cut to this.
_TRACEBACK_KEPT = 64 * 1024


@dataclass(frozen=True)
class Report:
    """A final report about a run, as the worker that held it would send it."""

    kind: ReportKind
    run_id: Id
    worker_id: Id
    # complete: {"result", "uploads"}, fail: {"error"}, release: {"reason"}; "uploads" lists
    # the files ({"file", "epoch"} or {"file", "kind"}) in the outbox's files directory to
    # upload before it.
    body: dict[str, Any]
    # The claim's attempt: the API refuses the report once that attempt is over (None in
    # reports an older agent stored).
    attempt: int | None = None

    def send(self, client: ApiClient) -> None:
        """Send it once; ApiError as the API answers."""
        run, worker, attempt = self.run_id, self.worker_id, self.attempt
        if self.kind == "complete":
            client.complete(run, worker, self.body["result"], attempt=attempt)
        elif self.kind == "fail":
            client.fail(run, worker, self.body["error"], attempt=attempt)
        else:
            client.release(run, worker, str(self.body["reason"]), attempt=attempt)


class Outbox:
    """Reports not yet taken by the API, one file per run: `run-<id>.json`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, run_id: Id) -> Path:
        """Where the report about `run_id` waits."""
        name = f"run-{run_id}.json"
        if _ENTRY.match(name) is None:  # the id becomes a file name
            raise ValueError(f"unexpected run id {run_id!r}")
        return self.directory / name

    def files_dir(self, run_id: Id) -> Path:
        """Where files that must reach the API before the run's report wait."""
        return self.path(run_id).with_suffix(".files")

    def put(self, report: Report) -> Path:
        """Store the report durably (a crash leaves the old file or the new one, never half)."""
        path = self.path(report.run_id)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_durably(path, json.dumps(asdict(report)))
        return path

    def set_aside(self, report: Report) -> Path:
        """Keep a copy of the report out of the way of sending (`refused/run-<id>.json`)."""
        refused = self.directory / "refused"
        refused.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = refused / self.path(report.run_id).name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(asdict(report), fh)
            fh.flush()
            os.fsync(fh.fileno())
        return path

    def remove(self, report: Report) -> None:
        """Forget the report and its files (it was taken, or refused for good)."""
        path = self.path(report.run_id)
        shutil.rmtree(self.files_dir(report.run_id), ignore_errors=True)
        if path.exists():
            path.unlink(missing_ok=True)
            fsync_path(self.directory)

    def pending(self) -> list[Report]:
        """The stored reports, oldest first; an unreadable file is set aside and logged."""
        if not self.directory.is_dir():
            return []
        found: list[tuple[float, Report]] = []
        for path in self.directory.iterdir():
            if _ENTRY.match(path.name) is None:
                continue
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                report = Report(
                    kind=data["kind"],
                    run_id=data["run_id"],
                    worker_id=data["worker_id"],
                    body=dict(data["body"]),
                    attempt=data.get("attempt"),
                )
                if report.kind not in ("complete", "fail", "release"):
                    raise ValueError(f"unknown report kind {report.kind!r}")
                found.append((path.stat().st_mtime, report))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                # put() never leaves a partial file, so this is damage from elsewhere: keep
                # the bytes for a person to look at, out of the way of the next start.
                log.error("outbox file %s is unreadable (%s); moved aside", path, exc)
                with contextlib.suppress(OSError):
                    path.rename(path.with_name(path.name + ".unreadable"))
        return [report for _, report in sorted(found, key=lambda item: item[0])]


class Courier:
    """Delivers reports through the outbox, retrying until the API takes or refuses them.

    While a report is on its way (its files uploading, the API away or busy) a thread keeps
    the run's lease with heartbeats as the worker that holds it, so a slow delivery costs
    nothing but time.
    """

    def __init__(
        self,
        client: ApiClient,
        outbox: Outbox,
        *,
        stop: threading.Event,
        heartbeat_seconds: float = 10.0,
        first_backoff: float = 0.5,
        max_backoff: float = MAX_BACKOFF,
    ) -> None:
        self.client = client
        self.outbox = outbox
        self.stop = stop
        self.heartbeat_seconds = heartbeat_seconds
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff

    def deliver(self, report: Report, *, stored: bool = False) -> Outcome:
        """Store the report (unless `stored`), then send it until it is taken or refused.

        Returns "kept" only when the agent is stopping: the report stays in the outbox and
        the next agent on this work directory sends it.
        """
        if not stored:
            self.outbox.put(report)
        with self._keeping_lease(report):
            return self._send_until_answered(report)

    def _send_until_answered(self, report: Report) -> Outcome:
        delay = self.first_backoff
        while True:
            try:
                report = self._upload_files(report)
                report.send(self.client)
            except ApiError as exc:
                if exc.status_code in _REFUSALS:
                    instead = self._instead_of_too_large(report, exc)
                    self._refused(report, exc)
                    if instead is not None:  # the run still learns why it has no result
                        self.deliver(instead)
                    return "refused"
                if self.stop.is_set():
                    log.warning(
                        "run %s: %s not delivered (%s); kept in %s for the next start",
                        report.run_id,
                        report.kind,
                        exc,
                        self.outbox.path(report.run_id),
                    )
                    return "kept"
                # The server's Retry-After when it gave one (429, 503), else our backoff.
                wait = exc.retry_after if exc.retry_after is not None else delay
                log.warning(
                    "run %s: %s not delivered (%s); next try in %.1f s",
                    report.run_id,
                    report.kind,
                    exc,
                    wait,
                )
                self.stop.wait(wait)
                delay = min(delay * 2, self.max_backoff)
                continue
            self.outbox.remove(report)
            log.info("run %s: %s delivered", report.run_id, report.kind)
            return "accepted"

    def deliver_pending(self) -> int:
        """Send what an earlier agent on this work directory left; the number taken."""
        taken = 0
        for report in self.outbox.pending():
            if self.stop.is_set():
                break
            log.info("run %s: sending the %s kept from before", report.run_id, report.kind)
            taken += self.deliver(report, stored=True) == "accepted"
        return taken

    def _upload_files(self, report: Report) -> Report:
        """Upload the files the report needs, each taken off the stored report once sent."""
        files = list(report.body.get("uploads") or [])
        while files:
            item = files[0]
            path = self.outbox.files_dir(report.run_id) / Path(str(item["file"])).name
            try:
                epoch = item.get("epoch")
                self.client.upload_artifact(
                    report.run_id,
                    report.worker_id,
                    path,
                    kind=str(item.get("kind", "checkpoint")),  # or "model": the final .keras
                    name=path.name,
                    epoch=None if epoch is None else int(epoch),
                    attempt=report.attempt,
                )
            except (OSError, UnsafeJobFile) as exc:  # gone, or not a regular file any more:
                # the API records the run without it
                log.error("run %s: cannot upload %s: %s", report.run_id, path, exc)
            except ApiError as exc:
                # The exported model is a convenience: an API that refuses it (too large,
                # or too old to know the kind) must not cost the run its result.
                if item.get("kind") != "model" or exc.retryable or isinstance(exc, LeaseLost):
                    raise
                log.error("run %s: the API refused the model %s: %s", report.run_id, path, exc)
            files.pop(0)
            report = replace(report, body={**report.body, "uploads": files})
            self.outbox.put(report)
        return report

    def _instead_of_too_large(self, report: Report, exc: ApiError) -> Report | None:
        """The report that tells the run why the API refused this one as too large, if any:
        a failure `ResultTooLarge` for a result (which is kept aside), a shorter traceback
        for a failure."""
        if exc.status_code != _TOO_LARGE:
            return None
        if report.kind == "complete":
            size = len(json.dumps(report.body.get("result"), separators=(",", ":")))
            kept = self.outbox.set_aside(report)
            log.error("run %s: result of %d bytes kept in %s", report.run_id, size, kept)
            message = (
                f"the worker finished the run, but the API refused its result of {size} bytes "
                f"as too large ({exc.detail}); the worker kept it in {kept}"
            )
            error = {"type": "ResultTooLarge", "message": message, "result_bytes": size}
            return replace(report, kind="fail", body={"error": error})
        error = dict(report.body.get("error") or {})
        traceback = str(error.get("traceback") or "")
        if report.kind != "fail" or len(traceback) <= _TRACEBACK_KEPT:
            return None
        cut = "[cut: the API refused it as too large]\n"
        error["traceback"] = cut + traceback[-_TRACEBACK_KEPT:]
        error["message"] = str(error.get("message", ""))[:_TRACEBACK_KEPT]
        return replace(report, kind="fail", body={"error": error})

    def _refused(self, report: Report, exc: ApiError) -> None:
        why = "the lease is gone" if isinstance(exc, LeaseLost) else "refused for good"
        log.error(
            "run %s: the API will not take the %s of worker %s (%s): %s; the report is dropped",
            report.run_id,
            report.kind,
            report.worker_id,
            why,
            exc,
        )
        self.outbox.remove(report)

    @contextlib.contextmanager
    def _keeping_lease(self, report: Report) -> Iterator[None]:
        """Heartbeats for the run, as the worker that holds it, once a heartbeat period for
        as long as the report is on its way: uploading its files (a long outage leaves many)
        and sending it can take longer than a lease, and a lapsed lease lets another worker
        take the run while its result is being delivered."""
        done = threading.Event()

        def keep() -> None:
            while not done.wait(self.heartbeat_seconds):
                try:
                    self.client.heartbeat(
                        report.run_id, report.worker_id, None, attempt=report.attempt
                    )
                except LeaseLost:
                    return  # the report itself gets the definitive answer
                except ApiError as exc:  # 429/5xx, away: the server keeps the lease a while
                    log.debug("run %s: heartbeat while delivering failed: %s", report.run_id, exc)
                except Exception:  # never let a bug end the heartbeats silently
                    log.exception("run %s: heartbeat while delivering failed", report.run_id)

        keeper = threading.Thread(target=keep, name=f"lease-{report.run_id}", daemon=True)
        keeper.start()
        try:
            yield
        finally:
            done.set()  # a heartbeat still on its way finds the run reported: refused, ignored
