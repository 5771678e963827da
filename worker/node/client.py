"""A small typed, synchronous HTTP client of the reprotrain API, used by the CLI and the agent."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from worker.node.api_errors import (
    ApiError,
    ApiUnreachable,
    ArtifactCorrupt,
    LeaseLost,
    file_sha256,
)
from worker.node.job_workspace import OpenedFile, open_regular
from worker.node.transport import API, Transport, as_dict

__all__ = [
    "ApiClient",
    "ApiError",
    "ApiUnreachable",
    "ArtifactCorrupt",
    "LeaseLost",
    "file_sha256",
]

Id = int | str  # resource ids only ever go into URLs and bodies as the server gave them
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


class ApiClient(Transport):
    """One method per API endpoint; returns parsed JSON and raises ApiError for non-2xx answers."""

    # -- people ------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """GET /healthz."""
        return as_dict(self._call("GET", "/healthz"))

    def submit(
        self,
        spec_text: str,
        *,
        content_type: str = "application/yaml",
        idempotency_key: str | None = None,
        copies: int | None = None,
    ) -> dict[str, Any]:
        """Submit a spec; returns {"experiment": ..., "run": ...} (and "audit" with copies)."""
        headers = {"Content-Type": content_type}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        response = self._call(
            "POST",
            f"{API}/experiments",
            idempotent=idempotency_key is not None,
            content=spec_text.encode(),
            headers=headers,
            params={"copies": copies} if copies is not None else None,
        )
        return as_dict(response)

    def compare(self, a: Id, b: Id) -> dict[str, Any]:
        """The comparison report of run b against run a."""
        return as_dict(self._call("GET", f"{API}/compare", params={"a": a, "b": b}))

    def refine(self, a: Id, b: Id) -> dict[str, Any]:
        """Queue the per-step re-trace of two diverged runs' divergent epoch."""
        body = {"a": a, "b": b}
        return as_dict(self._call("POST", f"{API}/compare/refine", json=body))

    def refinement(self, refinement_id: Id) -> dict[str, Any]:
        """A refinement: its runs' status and, once both finished, its report."""
        return as_dict(self._call("GET", f"{API}/compare/refine/{refinement_id}"))

    def reproducibility_audit(self, audit_id: Id) -> dict[str, Any]:
        """A reproducibility audit: its copies and whether they all agree."""
        return as_dict(self._call("GET", f"{API}/repro-audits/{audit_id}"))

    def experiments(self, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        """A page of experiments: {"items": [...], "total": n}."""
        params = {"limit": limit, "offset": offset}
        return as_dict(self._call("GET", f"{API}/experiments", params=params))

    def experiment(self, experiment_id: Id) -> dict[str, Any]:
        """One experiment."""
        return as_dict(self._call("GET", f"{API}/experiments/{experiment_id}"))

    def runs(
        self,
        status: str | None = None,
        experiment_id: Id | None = None,
        verdict: str | None = None,
        limit: int = 50,
        offset: int = 0,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """A filtered page of runs, newest first: {"items": [...], "next_cursor": c}; pass
        `next_cursor` back as `cursor` for the next page (None: there is none)."""
        filters = {"status": status, "experiment_id": experiment_id, "verdict": verdict}
        params: dict[str, Id | str] = {k: v for k, v in filters.items() if v is not None}
        params.update(limit=limit, offset=offset)
        if cursor is not None:
            params["cursor"] = cursor
        return as_dict(self._call("GET", f"{API}/runs", params=params))

    def run(self, run_id: Id) -> dict[str, Any]:
        """One run, with its latest progress event."""
        return as_dict(self._call("GET", f"{API}/runs/{run_id}"))

    def rerun(self, run_id: Id) -> dict[str, Any]:
        """Queue a rerun of a run; returns the new run."""
        return as_dict(self._call("POST", f"{API}/runs/{run_id}/rerun"))

    def cancel(self, run_id: Id) -> dict[str, Any]:
        """Cancel a queued or running run; returns the run."""
        return as_dict(self._call("POST", f"{API}/runs/{run_id}/cancel"))

    def create_token(
        self, name: str, role: str, *, expires_in_days: float | None = None
    ) -> dict[str, Any]:
        """Create a token (admins); the response holds its secret, shown only this once."""
        body = {"name": name, "role": role, "expires_in_days": expires_in_days}
        return as_dict(self._call("POST", f"{API}/tokens", json=body))

    def tokens(self) -> list[dict[str, Any]]:
        """Every token, without secrets (admins)."""
        response = self._call("GET", f"{API}/tokens")
        items: list[dict[str, Any]] = response.json()
        return items

    def revoke_token(self, token_id: Id) -> dict[str, Any]:
        """Revoke a token (admins)."""
        return as_dict(self._call("POST", f"{API}/tokens/{token_id}/revoke"))

    def audit(self, *, action: str | None = None, limit: int = 100) -> dict[str, Any]:
        """A page of the audit log, newest first (admins)."""
        params: dict[str, Id] = {"limit": limit}
        if action:
            params["action"] = action
        return as_dict(self._call("GET", f"{API}/audit", params=params))

    def wait(
        self,
        run_id: Id,
        *,
        timeout: float | None,
        poll: float = 0.5,
        on_update: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Until the run is succeeded, failed or cancelled; TimeoutError after `timeout` s.

        Follows the run's event stream, so the end is noticed as it happens (and the run is
        read again at each event, for `on_update`); polls every `poll` s instead when the
        stream is not available or breaks off.
        """
        deadline = None if timeout is None else time.monotonic() + timeout

        def check(run: dict[str, Any]) -> bool:
            if on_update is not None:
                on_update(run)
            if run.get("status") in TERMINAL_STATUSES:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} still {run.get('status')} after {timeout} s")
            return False

        read = None if deadline is None else max(deadline - time.monotonic(), 0.01)
        stream_timeout = self._timeout(read=read)
        with contextlib.suppress(httpx.HTTPError):  # no stream, or it broke off: poll below
            path = f"{API}/runs/{run_id}/events"
            with self._http.stream("GET", path, timeout=stream_timeout) as events:
                if events.is_success:
                    for line in events.iter_lines():
                        if line.startswith("data:"):
                            run = self.run(run_id)
                            if check(run):
                                return run
        while True:
            run = self.run(run_id)
            if check(run):
                return run
            pause = poll if deadline is None else min(poll, deadline - time.monotonic())
            time.sleep(max(pause, 0.0))

    # -- worker protocol ---------------------------------------------------------------------

    def register(
        self,
        name: str,
        *,
        executors: list[str],
        images: list[str],
        gpu: str | None,
        hostname: str,
        gpus: int | None = None,
        cpu_devices: int | None = None,
        accepts_code: bool = False,
        readiness_flags: list[dict[str, str]] | None = None,
        hardware_class: str | None = None,
        pool: str | None = None,
    ) -> dict[str, Any]:
        """Register a worker; returns {"id", "lease_seconds", "heartbeat_seconds", "devices"}.

        A server from before hardware classes refuses their fields (422): the worker is then
        registered without them, as that server knows no runs that require one."""
        body: dict[str, Any] = {
            "name": name,
            "executors": executors,
            "images": images,
            "gpu": gpu,
            "hostname": hostname,
        }
        # Sent only when known, so a server from before device counts still takes the body.
        body.update({k: v for k, v in (("gpus", gpus), ("cpu_devices", cpu_devices)) if v})
        if accepts_code:
            body["accepts_code"] = True
        if readiness_flags is not None:
            body["readiness_flags"] = readiness_flags
        newer = {k: v for k, v in (("hardware_class", hardware_class), ("pool", pool)) if v}
        try:
            return as_dict(self._call("POST", f"{API}/workers/register", json={**body, **newer}))
        except ApiError as exc:
            if not newer or exc.status_code != 422 or not _refused_fields(exc, newer):
                raise
        return as_dict(self._call("POST", f"{API}/workers/register", json=body))

    def enroll(self, name: str, *, hostname: str) -> dict[str, Any]:
        """Enroll a worker with this (bootstrap) token: {"id", "credential", "credential_id",
        "lease_seconds", ...}; the credential is the worker's own token, shown once."""
        body = {"name": name, "hostname": hostname}
        return as_dict(self._call("POST", f"{API}/workers/enroll", json=body))

    def claim(self, worker_id: Id, *, wait: float = 0) -> dict[str, Any] | None:
        """Lease the next run this worker can run: {"run", "lease", "checkpoint"}, or None.

        With `wait` the server holds the request up to that many seconds until a run is
        queued (a long poll), so an idle worker starts a new run at once.
        """
        path = f"{API}/workers/{worker_id}/claim"
        if wait <= 0:
            response = self._call("POST", path)
        else:
            read = self._http.timeout.read
            timeout = self._timeout(read=wait + (read or 30.0))
            response = self._call("POST", path, params={"wait": wait}, timeout=timeout)
        return None if response.status_code == 204 else as_dict(response)

    def join_gang(self, worker_id: Id, address: str) -> dict[str, Any]:
        """One try to be in a multi-host run's gang, reachable at `address`: {"state": "none"
        | "forming" | "formed", ...}; `formed` brings the run's claim."""
        response = self._call("POST", f"{API}/workers/{worker_id}/gang", json={"address": address})
        return as_dict(response)

    def gang_done(self, run_id: Id, worker_id: Id, *, attempt: int | None = None) -> None:
        """Say this gang member's job ended well (it heartbeats no more)."""
        self._call(
            "POST",
            f"{API}/runs/{run_id}/gang/done",
            idempotent=True,
            json=_holder(worker_id, attempt),
        )

    def heartbeat(
        self,
        run_id: Id,
        worker_id: Id,
        progress: dict[str, Any] | None,
        *,
        attempt: int | None = None,
        log: tuple[int, str] | None = None,
    ) -> dict[str, Any]:
        """Extend the lease and report progress, and new lines of the job's log (offset,
        text); LeaseLost when the worker no longer holds it (or no longer on `attempt`, the
        claim's: that attempt is over)."""
        body: dict[str, Any] = {**_holder(worker_id, attempt), "progress": progress}
        if log is not None:
            body["log"] = {"offset": log[0], "text": log[1]}
        # Repeating a heartbeat changes nothing more than sending it once.
        response = self._call(
            "POST", f"{API}/runs/{run_id}/heartbeat", idempotent=True, lease=True, json=body
        )
        return as_dict(response)

    def upload_artifact(
        self,
        run_id: Id,
        worker_id: Id,
        source: Path | OpenedFile,
        *,
        kind: str,
        name: str,
        epoch: int | None,
        attempt: int | None = None,
    ) -> dict[str, Any]:
        """Stream a file to the run's artifacts; returns {"id", "sha256", "size"}.

        `source` is a file already opened (a job's, through its workspace) or a path, opened
        here only if it is a regular file and not a link; either way every byte sent and
        hashed comes from one descriptor, so nothing swapped in by name is sent.
        """
        upload = functools.partial(
            self._upload, run_id, worker_id, kind=kind, name=name, epoch=epoch, attempt=attempt
        )
        if isinstance(source, OpenedFile):
            return upload(source)
        with open_regular(source) as opened:
            return upload(opened)

    def _upload(
        self,
        run_id: Id,
        worker_id: Id,
        source: OpenedFile,
        /,
        *,
        kind: str,
        name: str,
        epoch: int | None,
        attempt: int | None,
    ) -> dict[str, Any]:
        digest = source.sha256()
        params: dict[str, Id] = {**_holder(worker_id, attempt), "kind": kind, "name": name}
        if epoch is not None:
            params["epoch"] = epoch
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(source.size),  # known up front, so httpx does not chunk it
            "X-Content-SHA256": digest,
        }
        if self.presigned_uploads:
            fields = {**_holder(worker_id, attempt), "kind": kind, "name": name, "epoch": epoch}
            return self._upload_to_store(run_id, source, {**fields, "sha256": digest})
        url = f"{API}/runs/{run_id}/artifacts"

        def build() -> httpx.Request:
            # A fresh generator per attempt: a retried upload re-reads the file from the start.
            return self._http.build_request(
                "POST", url, params=params, headers=headers, content=source.chunks()
            )

        return as_dict(self._send(build, idempotent=False, lease=True))

    def _upload_to_store(
        self, run_id: Id, source: OpenedFile, fields: dict[str, Any]
    ) -> dict[str, Any]:
        """Ask for a presigned PUT, send the bytes straight to the object store, and report
        them; the server records them once it has checked their digest."""
        body = {**fields, "size": source.size}
        uploads = f"{API}/runs/{run_id}/artifact-uploads"
        ticket = as_dict(self._call("POST", uploads, idempotent=True, lease=True, json=body))
        self._send_to_store(
            lambda: self._store.build_request(
                ticket.get("method", "PUT"),
                ticket["url"],
                headers=ticket["headers"],
                content=source.chunks(),  # a fresh generator per attempt
            )
        ).close()
        done = f"{uploads}/{ticket['upload_id']}"
        return as_dict(self._call("POST", done, idempotent=False, lease=True, json=body))

    def download_artifact(self, artifact_id: Id, dest: Path, *, sha256: str) -> Path:
        """Download an artifact to `dest`, which appears only once its SHA-256 matches."""
        return self._download(f"{API}/artifacts/{artifact_id}", dest, sha256=sha256)

    def _download_stored(self, kind: str, digest: str, dest: Path) -> Path:
        url = f"{API}/{kind}/{digest}/content"
        return self._download(url, dest, sha256=digest.removeprefix("sha256:"))

    def download_dataset(self, digest: str, dest: Path) -> Path:
        """Download a dataset to `dest`, which appears only once its digest matches."""
        return self._download_stored("datasets", digest, dest)

    def download_code_bundle(self, digest: str, dest: Path) -> Path:
        """Download a code bundle (wheel) to `dest`, which appears only once its digest matches."""
        return self._download_stored("code", digest, dest)

    def download_model_definition(self, digest: str, dest: Path) -> Path:
        """Download a model definition to `dest`, which appears only once its digest matches."""
        return self._download_stored("models", digest, dest)

    def complete(
        self, run_id: Id, worker_id: Id, result: dict[str, Any], *, attempt: int | None = None
    ) -> dict[str, Any]:
        """Report the job's result document; the server marks the run by result["status"]."""
        body = {**_holder(worker_id, attempt), "result": result}
        return as_dict(self._call("POST", f"{API}/runs/{run_id}/complete", lease=True, json=body))

    def fail(
        self, run_id: Id, worker_id: Id, error: dict[str, Any], *, attempt: int | None = None
    ) -> dict[str, Any]:
        """Report a job that left no result document; error is {"type", "message", "traceback"}."""
        body = {**_holder(worker_id, attempt), "error": error}
        return as_dict(self._call("POST", f"{API}/runs/{run_id}/fail", lease=True, json=body))

    def release(
        self, run_id: Id, worker_id: Id, reason: str, *, attempt: int | None = None
    ) -> dict[str, Any]:
        """Give the run back to the queue without counting a failure."""
        body = {**_holder(worker_id, attempt), "reason": reason}
        return as_dict(self._call("POST", f"{API}/runs/{run_id}/release", lease=True, json=body))


def _refused_fields(exc: ApiError, fields: dict[str, Any]) -> bool:
    """Whether a 422 names one of `fields` (as an unknown field of an older server)."""
    said = " ".join(str(e.get("loc", "")) for e in exc.errors if isinstance(e, dict))
    said += f" {exc.detail}"
    return any(name in said for name in fields)


def _holder(worker_id: Id, attempt: int | None) -> dict[str, Id]:
    """Who reports about a run: the worker, and the attempt when it knows it."""
    return {"worker_id": worker_id} | ({} if attempt is None else {"attempt": attempt})
