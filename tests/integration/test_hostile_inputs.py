"""Hostile clients against a real `repro serve` process: huge chunked bodies and declared
lengths over the limits, deep and huge JSON from workers, 5000-digit integers, uploads past
the artifact limit, and what the server leaves readable on disk or prints.

Every test talks to 127.0.0.1 only, sends a bounded amount and stops by itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import select
import socket
import stat
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.hostile_clients import (
    CLIENT_PATIENCE,
    MIB,
    answer_status,
    service,
    start_server,
    still_serves,
)
from tests.integration.jobs import REPO
from tests.integration.service_procs import Service

__all__ = ["service"]

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
GIB = 1024**3
# How much the server's resident memory may grow while it refuses a 1 GiB body.
RSS_BOUND = 100 * MIB


def _memory(service: Service, field: str) -> int:
    """A memory figure of the server process from /proc (VmRSS: now; VmHWM: peak), in bytes."""
    with open(f"/proc/{service.proc.pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"{field} missing from /proc/{service.proc.pid}/status")


def _rss(service: Service) -> int:
    return _memory(service, "VmRSS")


def _peak_rss(service: Service) -> int:
    return _memory(service, "VmHWM")


def stream_chunked(port: int, head: bytes, total: int, chunk: int = 256 * 1024) -> tuple[int, int]:
    """Send `head`, then a chunked body of `total` bytes until the server answers.

    Returns (status of the answer, body bytes sent). Reading and writing are interleaved,
    so an answer given before the body is read is seen while the body is still going out.
    """
    frame = b"%x\r\n" % chunk + b"\0" * chunk + b"\r\n"
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    pending, sent, answer, writable = head, 0, b"", True
    deadline = time.monotonic() + CLIENT_PATIENCE
    try:
        while time.monotonic() < deadline and b"\r\n\r\n" not in answer:
            wants = [sock] if writable and (pending or sent < total) else []
            readable, can_write, _ = select.select([sock], wants, [], 1.0)
            if readable:
                try:
                    piece = sock.recv(65536)
                except ConnectionResetError:
                    break
                if not piece:
                    break
                answer += piece
                continue
            if can_write:
                if not pending:
                    pending = frame if sent + chunk <= total else b"0\r\n\r\n"
                    sent += chunk if pending is frame else 0
                try:
                    pending = pending[sock.send(pending) :]
                except (BrokenPipeError, ConnectionResetError):
                    writable = False  # the server stopped reading: its answer may be there
    finally:
        sock.close()
    status = answer_status(answer)
    assert status is not None, f"no HTTP answer after sending {sent} bytes: {answer[:200]!r}"
    return status, sent


def _head(path: str, token: str | None, content_type: str = "application/json") -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        "Transfer-Encoding: chunked",
        f"Content-Type: {content_type}",
    ]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# --- bodies ---------------------------------------------------------------------------------


# A route whose JSON body FastAPI reads before its dependencies (the token check) run, and one
# whose body a dependency reads after the token check.
@pytest.mark.parametrize("path", ["/api/v1/runs/1/heartbeat", "/api/v1/experiments"])
def test_a_gigabyte_chunked_body_without_a_token_is_refused_before_it_is_read(
    service: Service, path: str
) -> None:
    before = _rss(service)
    status, sent = stream_chunked(service.port, _head(path, None), GIB)
    assert status == 401
    assert sent < 64 * MIB, f"the client got {sent} bytes out before the server answered"
    assert _peak_rss(service) - before <= RSS_BOUND
    still_serves(service)


def test_a_gigabyte_chunked_spec_with_a_valid_token_stops_at_the_json_limit(
    service: Service,
) -> None:
    before = _rss(service)
    status, sent = stream_chunked(
        service.port, _head("/api/v1/experiments", service.admin_token), GIB
    )
    assert status == 413
    assert sent < 64 * MIB
    assert _peak_rss(service) - before <= RSS_BOUND
    still_serves(service)


def test_a_body_with_a_malformed_token_is_refused_like_one_without(service: Service) -> None:
    status, sent = stream_chunked(service.port, _head("/api/v1/runs/1/heartbeat", "x" * 500), GIB)
    assert status == 401
    assert sent < 64 * MIB


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_sent(
    service: Service,
) -> None:
    with socket.create_connection(("127.0.0.1", service.port), timeout=CLIENT_PATIENCE) as sock:
        sock.sendall(
            b"POST /api/v1/experiments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n"
            % (service.admin_token.encode(), GIB)
        )
        assert answer_status(sock.recv(4096)) == 413


# --- a run held by a worker, and JSON it sends --------------------------------------------


def _held_run(service: Service, name: str) -> tuple[httpx.Client, int, int]:
    """A worker's client, its id and a run it holds (claimed from the queue)."""
    worker = service.client_for("worker", name)
    worker_id = worker.post("/api/v1/workers/register", json={"name": name}).json()["id"]
    submitted = service.submit(SEED001, **{"Idempotency-Key": f"held-{name}"})
    assert submitted.status_code in (200, 201), submitted.text
    claimed = worker.post(f"/api/v1/workers/{worker_id}/claim")
    assert claimed.status_code == 200, claimed.text
    return worker, worker_id, int(claimed.json()["run"]["id"])


def _nested(depth: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        doc = {"a": doc}
    return doc


def _run_pages_answer(service: Service, run_id: int) -> None:
    for path in (f"/api/v1/runs/{run_id}", "/api/v1/runs", "/api/v1/runs?status=running"):
        page = service.client.get(path)
        assert page.status_code == 200, (path, page.text[:300])


def _refuses_deep_and_huge_json(service: Service, name: str) -> None:
    worker, worker_id, run_id = _held_run(service, name)
    beat = f"/api/v1/runs/{run_id}/heartbeat"
    deep = worker.post(beat, json={"worker_id": worker_id, "progress": _nested(300)})
    assert deep.status_code == 422, deep.text
    [problem] = deep.json()["errors"]
    assert problem["loc"] == "body.progress"
    assert "nests deeper than" in problem["msg"] and "a.a.a" in problem["msg"]

    wide = {f"k{i}": i for i in range(5_000)}
    too_many = worker.post(beat, json={"worker_id": worker_id, "progress": wide})
    assert too_many.status_code == 422 and "keys and values" in too_many.text

    failure = {"type": "Crash", "message": "boom", "details": _nested(300)}
    failed = worker.post(
        f"/api/v1/runs/{run_id}/fail", json={"worker_id": worker_id, "error": failure}
    )
    assert failed.status_code == 422, failed.text
    assert failed.json()["errors"][0]["loc"] == "body.error"

    result = {"status": "succeeded", "provenance": _nested(300)}
    completed = worker.post(
        f"/api/v1/runs/{run_id}/complete", json={"worker_id": worker_id, "result": result}
    )
    assert completed.status_code == 422, completed.text
    assert "provenance nests deeper than" in completed.text

    # Python's json nests about a thousand levels before it gives up: still a 4xx, not a 500.
    raw = b'{"worker_id": %d, "progress": %s}' % (worker_id, b'{"a":' * 5000 + b"1" + b"}" * 5000)
    deepest = worker.post(beat, content=raw, headers={"Content-Type": "application/json"})
    assert deepest.status_code == 400, deepest.text

    # Nothing of it was stored: the run's pages answer, and a normal heartbeat is taken.
    _run_pages_answer(service, run_id)
    fine = worker.post(beat, json={"worker_id": worker_id, "progress": {"epoch": 1, "step": 3}})
    assert fine.status_code == 200, fine.text
    assert service.client.get(f"/api/v1/runs/{run_id}").json()["progress"] == {
        "epoch": 1,
        "step": 3,
    }
    _run_pages_answer(service, run_id)


def test_deep_and_huge_worker_json_is_refused_and_the_runs_pages_keep_answering(
    service: Service,
) -> None:
    _refuses_deep_and_huge_json(service, "deep-sqlite")


def test_deep_worker_json_is_refused_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    svc = start_server(tmp_path / "data", database_url=postgres_url)
    try:
        svc.wait_ready()
        _refuses_deep_and_huge_json(svc, "deep-postgres")
    finally:
        svc.stop()


def test_an_integer_of_5000_digits_is_refused_with_a_4xx(service: Service) -> None:
    huge = "9" * 5000
    worker, worker_id, run_id = _held_run(service, "digits")
    beat = worker.post(
        f"/api/v1/runs/{run_id}/heartbeat",
        content=f'{{"worker_id": {worker_id}, "progress": {{"n": {huge}}}}}',
        headers={"Content-Type": "application/json"},
    )
    assert beat.status_code == 422, beat.text
    assert "5000 digits" in beat.json()["detail"]
    spec = json.dumps({"name": "digits"})[:-1] + f', "seed": {huge}}}'
    for content, content_type in (
        (spec, "application/json"),
        (f"name: x\nseed: {huge}\n", "application/yaml"),
    ):
        answer = service.submit(content, content_type=content_type)
        assert answer.status_code == 422, answer.text
        assert "digits" in answer.json()["detail"]
    # A number too large for a double reads as infinity, which JSON cannot store.
    inf = worker.post(
        f"/api/v1/runs/{run_id}/heartbeat",
        content=f'{{"worker_id": {worker_id}, "progress": {{"x": 1e999}}}}',
        headers={"Content-Type": "application/json"},
    )
    assert inf.status_code == 422, inf.text
    still_serves(service)


def test_an_upload_past_the_artifact_limit_is_cut_off_at_the_limit(service: Service) -> None:
    worker, worker_id, run_id = _held_run(service, "uploader")
    token = worker.headers["Authorization"].removeprefix("Bearer ")
    path = f"/api/v1/runs/{run_id}/artifacts?worker_id={worker_id}&kind=checkpoint&name=big.bin"
    head = _head(path, token, "application/octet-stream").replace(
        b"\r\n\r\n", b"\r\nX-Content-SHA256: " + b"0" * 64 + b"\r\n\r\n", 1
    )
    before = _rss(service)
    status, sent = stream_chunked(service.port, head, GIB)
    assert status == 413
    assert sent < 16 * MIB + 64 * MIB  # the limit, plus what the sockets buffer
    assert _peak_rss(service) - before <= RSS_BOUND
    still_serves(service)


# --- what the server leaves on disk and prints ------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_database_wal_artifacts_and_tokens_are_owner_only(service: Service) -> None:
    worker, worker_id, run_id = _held_run(service, "modes")
    content = b"the exported model\n"
    digest = hashlib.sha256(content).hexdigest()
    uploaded = worker.post(
        f"/api/v1/runs/{run_id}/artifacts",
        params={"worker_id": worker_id, "kind": "model", "name": "model.keras"},
        content=content,
        headers={"X-Content-SHA256": digest, "Content-Type": "application/octet-stream"},
    )
    assert uploaded.status_code == 201, uploaded.text
    data = service.data_dir
    artifact = data / "artifacts" / digest[:2] / digest
    files = [
        data / "reprotrain.db",
        data / "reprotrain.db-wal",  # the server holds the database open: WAL and index exist
        data / "reprotrain.db-shm",
        data / "admin-token",
        artifact,
    ]
    for path in files:
        assert _mode(path) == 0o600, f"{path} is {oct(_mode(path))}"
    for directory in (data, data / "artifacts", artifact.parent):
        assert _mode(directory) == 0o700, f"{directory} is {oct(_mode(directory))}"
    leftovers = [p for p in data.rglob("*") if p.is_file() and _mode(p) & 0o077]
    assert leftovers == []


def test_docs_load_only_from_this_server(service: Service) -> None:
    page = httpx.get(f"{service.url}/docs", timeout=30)
    assert page.status_code == 200
    assert "://" not in page.text and "//cdn" not in page.text
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert {a.rsplit("/", 1)[-1] for a in assets} >= {"swagger-ui-bundle.js", "swagger-ui.css"}
    loaded = {}
    for asset in assets:
        assert asset.startswith("/"), asset
        answer = httpx.get(f"{service.url}{asset}", timeout=30)
        assert answer.status_code == 200 and answer.content, asset
        loaded[asset.rsplit("/", 1)[-1]] = answer.text if asset.endswith((".js", ".css")) else ""
    assert "SwaggerUIBundle" in loaded["swagger-ui-bundle.js"]
    assert ".swagger-ui" in loaded["swagger-ui.css"]
    assert httpx.get(f"{service.url}/openapi.json", timeout=30).status_code == 200


def test_the_startup_log_prints_no_part_of_the_admin_secret(service: Service) -> None:
    secret = service.admin_token.split("_", 2)[2]
    log = service.log.read_text()
    assert "admin-token" in log  # it says where the token is kept instead
    shown = [secret[i : i + 6] for i in range(len(secret) - 5) if secret[i : i + 6] in log]
    assert shown == []
