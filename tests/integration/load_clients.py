"""Many cheap HTTP clients that wait on a server: event streams and long-poll claims.

Plain asyncio sockets rather than an HTTP library, so one test process can hold hundreds
of connections open on a busy machine. Loopback only; each client stops by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from dataclasses import dataclass, field


def raise_open_files_limit(wanted: int = 4096) -> int:
    """Raise this process's soft limit on open files toward `wanted` (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def _request(
    port: int, method: str, path: str, token: str
) -> tuple[int, dict[str, str], asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: 0\r\n\r\n".encode()
        )
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    except BaseException:  # cancelled or refused: the socket is not left to the collector
        writer.close()
        raise
    status = int(head[0].split()[1])
    headers = {}
    for line in head[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return status, headers, reader, writer


@dataclass
class Stream:
    """One `GET /runs/{id}/events`: what it received and how it ended."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    first_event: asyncio.Event = field(default_factory=asyncio.Event)
    ended_cleanly: bool = False  # the chunked body's last chunk arrived before the close
    error: str | None = None

    @property
    def statuses(self) -> list[str]:
        """The run statuses the stream reported, in order."""
        import json

        return [
            json.loads(line[len(b"data: ") :])["status"]
            for line in self.body.split(b"\n")
            if line.startswith(b"data: ")
        ]


async def follow(port: int, run_id: int, token: str, stream: Stream) -> None:
    """Open an event stream and read it until the server ends it (or it is cancelled)."""
    writer = None
    try:
        stream.status, stream.headers, reader, writer = await _request(
            port, "GET", f"/api/v1/runs/{run_id}/events", token
        )
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            stream.body += chunk
            if b"data: " in stream.body:
                stream.first_event.set()
            if stream.body.endswith(b"\r\n0\r\n\r\n"):
                stream.ended_cleanly = True
                break
            if stream.status != 200 and b"}" in stream.body:
                break
    except (OSError, asyncio.IncompleteReadError) as exc:
        stream.error = repr(exc)
    finally:
        stream.first_event.set()  # a refused or failed stream does not keep anyone waiting
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


@dataclass
class Claims:
    """One worker's long-poll claims, repeated until `stop` is set."""

    statuses: list[int] = field(default_factory=list)
    error: str | None = None


async def claim_until(
    port: int, worker_id: int, token: str, claims: Claims, stop: asyncio.Event, wait: float = 30
) -> None:
    """Claim with `wait` again and again (a 204 is answered when `wait` ends) until `stop`."""
    while not stop.is_set():
        writer = None
        try:
            status, _, _reader, writer = await _request(
                port, "POST", f"/api/v1/workers/{worker_id}/claim?wait={wait}", token
            )
            claims.statuses.append(status)
            if status not in (200, 204):
                return
        except (OSError, asyncio.IncompleteReadError) as exc:
            claims.error = repr(exc)
            return
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of the values, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def timed_get(port: int, path: str, token: str) -> tuple[int, float]:
    """One request on a fresh connection: its status and seconds to the whole response."""
    started = time.perf_counter()
    status, headers, reader, writer = await _request(port, "GET", path, token)
    try:
        await reader.readexactly(int(headers.get("content-length", "0")))
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return status, time.perf_counter() - started
