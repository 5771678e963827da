"""The server the hostile-client tests talk to, and what they share: a `repro serve` process
with short deadlines and a small upload limit, started once per test module, and how a raw
HTTP answer is read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.service_procs import Service

MIB = 1024**2
# The test server's limits: short deadlines so slow clients are seen quickly, and a small
# upload limit so a refused upload is cheap.
ENV = {
    "REPRO_HEADER_TIMEOUT_SECONDS": "1",
    "REPRO_BODY_TIMEOUT_SECONDS": "2",
    "REPRO_MAX_ARTIFACT_BYTES": str(16 * MIB),
}
# Long enough that a test never waits on it: the server's deadlines are far shorter.
CLIENT_PATIENCE = 60.0


def start_server(data_dir: Path, database_url: str | None = None) -> Service:
    # A permissive umask for the server: the modes it sets must not depend on it.
    previous = os.umask(0)
    try:
        return Service(data_dir, database_url=database_url, env=ENV, extra=("--no-demo",))
    finally:
        os.umask(previous)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = start_server(tmp_path_factory.mktemp("hostile") / "data")
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


def answer_status(answer: bytes) -> int | None:
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    return int(match.group(1)) if match else None


def still_serves(service: Service) -> None:
    assert service.client.get("/healthz").status_code == 200
    assert service.client.get("/api/v1/runs").status_code == 200
