"""A worker's own credential: enrolled once with the fleet's bootstrap token, then kept in
the work directory (owner-only) and used instead of the bootstrap token.

Revoking one worker's credential stops that worker alone, and the bootstrap token can be
rotated (a new one given to new machines, the old one revoked) without touching the
workers already enrolled. The credential is bound to the worker's name: the file keeps
both, and an agent started with another `--name` on the same work directory is refused.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path

from worker.node.client import ApiClient, ApiError
from worker.record.durable import replace_durably

log = logging.getLogger("reprotrain.agent")
CREDENTIAL_FILE = "credential.json"
MAX_BACKOFF = 30.0


class EnrollmentError(RuntimeError):
    """The worker cannot get or use its own credential; the message says what to do."""


def credential_path(work_dir: Path) -> Path:
    """Where the worker keeps its credential."""
    return work_dir / CREDENTIAL_FILE


def worker_credential(
    api: str, bootstrap: str | None, work_dir: Path, name: str | None
) -> tuple[str, str]:
    """(the worker's name, its own credential): the ones kept in `work_dir`, else a new
    credential enrolled with the `bootstrap` token under `name` (default: the host name),
    kept there before it is used."""
    path = credential_path(work_dir)
    if path.exists():
        kept = json.loads(path.read_text(encoding="utf-8"))
        if name is not None and name != kept["name"]:
            raise EnrollmentError(
                f"this work directory holds the credential of worker {kept['name']!r}, not "
                f"{name!r}: start it without --name (or as {kept['name']!r}), or use another "
                "work directory"
            )
        return str(kept["name"]), str(kept["credential"])
    if not bootstrap:
        raise EnrollmentError(
            "enrolling needs the fleet's bootstrap token (--token-file or REPRO_TOKEN)"
        )
    name = name or socket.gethostname()
    answer = _enroll(api, bootstrap, name)
    _keep(path, {"name": name, "credential": answer["credential"], "id": answer["id"],
                 "credential_id": answer["credential_id"]})  # fmt: skip
    log.info("enrolled as worker %s (%s); credential kept in %s", answer["id"], name, path)
    return name, str(answer["credential"])


def _enroll(api: str, bootstrap: str, name: str) -> dict[str, object]:
    delay = 1.0
    with ApiClient(api, bootstrap) as client:
        while True:
            try:
                return client.enroll(name, hostname=socket.gethostname())
            except ApiError as exc:
                if not exc.retryable:
                    raise EnrollmentError(f"cannot enroll as {name!r}: {exc}") from None
                wait = exc.retry_after if exc.retry_after is not None else delay
                log.warning("cannot enroll (%s); retrying in %.1f s", exc, wait)
                time.sleep(wait)
                delay = min(delay * 2, MAX_BACKOFF)


def _keep(path: Path, doc: dict[str, object]) -> None:
    """Write the credential owner-only and durably, whole or not at all."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    replace_durably(path, json.dumps(doc))


def refused_hint(work_dir: Path) -> str:
    """What to say when the API refuses the kept credential (revoked or expired)."""
    return (
        "the API refused this worker's own credential (revoked or expired); an operator "
        f"enrolls it again by removing {credential_path(work_dir)} and starting the agent "
        "with --enroll and a valid bootstrap token"
    )
