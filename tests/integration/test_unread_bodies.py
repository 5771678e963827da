"""Bodies the application never reads, against a real `repro serve` process: a route that
answers before reading (405, 404, 401 for an invalid token) must close the connection, so
the rest of the body is neither read without a deadline nor without a limit.

Every test talks to 127.0.0.1 only, sends a bounded amount and stops by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import select
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.hostile_clients import ENV, MIB, answer_status, still_serves
from tests.integration.load_clients import raise_open_files_limit, timed_get
from tests.integration.service_procs import Service

LIMIT = 4 * MIB  # every body limit of the test server: JSON, uploads and dataset pushes
BODY_TIMEOUT = float(ENV["REPRO_BODY_TIMEOUT_SECONDS"])
# The server answers and closes as soon as the headers are in; this leaves room for a
# loaded machine while staying far below how long each client keeps going.
CLOSED_WITHIN = BODY_TIMEOUT + 6
CLIENT_GIVES_UP = 25.0
# A well-formed token no server issued: the route refuses it before reading the body.
FORGED = "rpt_1_" + "x" * 43


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    env = {
        **ENV,
        "REPRO_MAX_BODY_BYTES": str(LIMIT),
        "REPRO_MAX_ARTIFACT_BYTES": str(LIMIT),
        "REPRO_MAX_DATASET_BYTES": str(LIMIT),
    }
    data_dir: Path = tmp_path_factory.mktemp("unread") / "data"
    svc = Service(data_dir, env=env, extra=("--no-demo",))
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


@dataclass
class Outcome:
    """What a client streaming a chunked body saw."""

    answer: bytes
    sent: int  # body bytes the server took before it closed (or the client gave up)
    closed_after: float | None  # seconds from the request to the server closing; None: open


def chunked_head(method: str, path: str, token: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        f"{auth}Transfer-Encoding: chunked\r\n\r\n"
    ).encode()


def stream_body(port: int, head: bytes, *, chunk: int, every: float, most: int) -> Outcome:
    """Send `head` and then chunks of `chunk` bytes every `every` seconds, until the server
    closes, `most` bytes are sent, or the client gives up."""
    piece = b"%x\r\n%s\r\n" % (chunk, b"a" * chunk)
    answer, sent = b"", 0
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_GIVES_UP) as sock:
        sock.sendall(head)
        while time.monotonic() - started < CLIENT_GIVES_UP:
            readable, writable, _ = select.select([sock], [sock], [], every)
            if readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if not data:
                    return Outcome(answer, sent, time.monotonic() - started)
                answer += data
            if writable and sent < most:
                try:
                    sock.sendall(piece)
                except (BrokenPipeError, ConnectionResetError):
                    return Outcome(answer + _rest(sock), sent, time.monotonic() - started)
                sent += chunk
            elif sent >= most:
                time.sleep(every)
    return Outcome(answer, sent, None)


def _rest(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/healthz", 405),
        ("POST", "/no/such/page", 404),
        ("PUT", "/readyz", 405),
    ],
)
def test_a_trickled_body_nobody_reads_is_cut_off(
    service: Service, method: str, path: str, status: int
) -> None:
    # Ten bytes a quarter second would go on for as long as the client liked.
    got = stream_body(service.port, chunked_head(method, path), chunk=10, every=0.25, most=LIMIT)
    assert got.closed_after is not None, f"still open after {CLIENT_GIVES_UP} s"
    assert got.closed_after < CLOSED_WITHIN, got.closed_after
    assert answer_status(got.answer) == status, got.answer[:300]
    assert b"connection: close" in got.answer.lower(), got.answer[:300]
    still_serves(service)


LARGE_BODY_ROUTES = [
    "/api/v1/runs/1/artifacts?name=model.bin",
    "/api/v1/datasets?name=d",
    "/api/v1/runs/1/complete",  # JSON, but parsed before the route's own token check ran
]


@pytest.mark.parametrize("path", LARGE_BODY_ROUTES)
def test_an_upload_refused_for_its_token_is_not_read_on(service: Service, path: str) -> None:
    # As fast as loopback takes it, up to four times the limit: a server that kept reading
    # after the 401 would take it all (and answer 413 once past the limit).
    head = chunked_head("POST", path, FORGED)
    got = stream_body(service.port, head, chunk=64 * 1024, every=0.01, most=4 * LIMIT)
    assert got.closed_after is not None, f"{got.sent} bytes taken and still open"
    assert got.closed_after < CLOSED_WITHIN, got.closed_after
    assert got.sent <= LIMIT, f"{got.sent} bytes taken after the answer"
    assert answer_status(got.answer) == 401, got.answer[:300]
    still_serves(service)


def test_a_result_from_a_role_that_reports_none_is_refused_before_its_body(
    service: Service,
) -> None:
    # A valid token whose role may not report results: 403 up front, not after the body.
    head = chunked_head("POST", "/api/v1/runs/1/complete", service.admin_token)
    got = stream_body(service.port, head, chunk=64 * 1024, every=0.01, most=4 * LIMIT)
    assert got.closed_after is not None and got.closed_after < CLOSED_WITHIN, got
    assert answer_status(got.answer) == 403, got.answer[:300]
    still_serves(service)


def test_a_body_nobody_reads_arriving_whole_is_answered_and_closed(service: Service) -> None:
    # The whole body in one go: the answer is still right, and says the connection ends.
    with socket.create_connection(("127.0.0.1", service.port), timeout=CLIENT_GIVES_UP) as sock:
        sock.sendall(chunked_head("POST", "/healthz") + b"5\r\nhello\r\n0\r\n\r\n")
        answer = b""
        while piece := _rest(sock):
            answer += piece
    assert answer_status(answer) == 405, answer[:300]
    still_serves(service)


# Load: far more connections than the server has file descriptors, each sending one chunk
# of a body nobody reads and then nothing. Every one must be answered and closed, so the
# server never runs out of descriptors and `/healthz` keeps answering.
SERVER_OPEN_FILES = 256
STALLERS, BATCH = 2000, 200
PROBE_PATIENCE = 5.0
ANSWER_PATIENCE = 30.0  # connect and answer on a machine busy with other tests


@pytest.fixture
def cramped_service(tmp_path: Path) -> Iterator[Service]:
    raise_open_files_limit(4 * BATCH)  # this process holds a batch, the server must not
    # The heads arrive whole; a loaded machine may take over a second to read 200 of them,
    # which the 1 s header deadline of the other tests here would cut off.
    env = {**ENV, "REPRO_HEADER_TIMEOUT_SECONDS": str(ANSWER_PATIENCE)}
    svc = Service(tmp_path / "data", env=env, extra=("--no-demo",))
    try:
        limit = (SERVER_OPEN_FILES, SERVER_OPEN_FILES)
        resource.prlimit(svc.proc.pid, resource.RLIMIT_NOFILE, limit)
        assert resource.prlimit(svc.proc.pid, resource.RLIMIT_NOFILE) == limit
        yield svc.wait_ready()
    finally:
        svc.stop()


async def stall(port: int) -> str | None:
    """POST a chunked body to /healthz, send one more chunk once answered, then nothing;
    None when the server answered 405 and closed the connection in time, else what went
    wrong. Only the close is held to CLOSED_WITHIN: a loaded machine may be slow to answer
    two hundred connections at once, but once it has answered it must not hold one open."""
    try:
        async with asyncio.timeout(ANSWER_PATIENCE):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except (TimeoutError, OSError) as exc:
        return f"connect: {exc!r}"
    try:
        try:
            async with asyncio.timeout(ANSWER_PATIENCE):
                writer.write(chunked_head("POST", "/healthz") + b"5\r\nhello\r\n")
                await writer.drain()
                answer = await reader.readuntil(b"\r\n\r\n")
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            return f"no answer within {ANSWER_PATIENCE} s: {exc!r}"
        if answer_status(answer) != 405:
            return f"answered {answer[:40]!r}"
        try:
            async with asyncio.timeout(CLOSED_WITHIN):
                with contextlib.suppress(ConnectionError):  # closed already: as it should be
                    writer.write(b"5\r\nhello\r\n")  # the byte that used to hold it open
                    await writer.drain()
                    await reader.read()  # to the end: the server closed
        except TimeoutError:
            return f"held open {CLOSED_WITHIN} s past its answer"
        return None
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def probe_until(port: int, done: asyncio.Event, failures: list[str]) -> int:
    """GET /healthz on fresh connections until `done`; how many answered, failures noted."""
    answered = 0
    while not done.is_set():
        try:
            async with asyncio.timeout(PROBE_PATIENCE):
                status, _ = await timed_get(port, "/healthz", "")
        except (TimeoutError, OSError) as exc:
            failures.append(f"/healthz: {exc!r}")
            continue
        if status != 200:
            failures.append(f"/healthz answered {status}")
        answered += 1
        await asyncio.sleep(0.2)
    return answered


@pytest.mark.load
def test_thousands_of_stalled_bodies_leave_the_server_answering(
    cramped_service: Service,
) -> None:
    port = cramped_service.port

    async def main() -> tuple[int, list[str], int, list[str]]:
        done, failures = asyncio.Event(), list[str]()
        prober = asyncio.create_task(probe_until(port, done, failures))
        tried, held = 0, list[str]()
        try:
            budget = STALLERS / BATCH * (ANSWER_PATIENCE + CLOSED_WITHIN + 10)
            async with asyncio.timeout(budget):
                for _ in range(STALLERS // BATCH):
                    outcomes = await asyncio.gather(*(stall(port) for _ in range(BATCH)))
                    tried += len(outcomes)
                    held += [outcome for outcome in outcomes if outcome is not None]
                    if held:
                        break  # held open: the next batches would only pile up
        finally:
            done.set()
            answered = await prober
        return tried, held, answered, failures

    tried, held, answered, failures = asyncio.run(main())
    assert not held, f"{len(held)} of {tried}, e.g. {sorted(set(held))[:3]}"
    assert tried == STALLERS
    assert not failures, failures[:5]
    assert answered > 0
    still_serves(cramped_service)
