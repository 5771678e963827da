"""HAProxy in front of several `repro serve` processes, with the compose stack's own
configuration (deploy/compose/haproxy.cfg): what the tests of API replicas talk to.

Debian's `haproxy` package (.ci/system-deps.sh installs it); without it the tests that need
it skip, saying so (and fail under CI=true). The proxy runs in the foreground of its own
process group and stops with the test, or with its watchdog when the test process dies.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.ports import HOST, free_port

CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "compose" / "haproxy.cfg"
_START_SECONDS = 30.0

_WATCHDOG = """
import os, signal, sys
pid = int(sys.argv[1])
if sys.stdin.buffer.read() != b"stopped":
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
"""


def haproxy_binary() -> str | None:
    """Debian's haproxy (in /usr/sbin, which is not on every PATH), if installed."""
    found = shutil.which("haproxy")
    if found is None and os.access("/usr/sbin/haproxy", os.X_OK):
        found = "/usr/sbin/haproxy"
    return found


def need_haproxy() -> str:
    """The haproxy executable, or a skip saying how to get it."""
    found = haproxy_binary()
    if found is None:
        pytest.skip("HAProxy is not installed (Debian package 'haproxy'; .ci/system-deps.sh)")
    return found


class ApiProxy:
    """One port in front of two API processes, routing as the compose stack's proxy does."""

    def __init__(self, replicas: tuple[str, str], log: Path) -> None:
        self.port = free_port()
        self.replicas = replicas  # host:port of each
        self.log = log
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> ApiProxy:
        env = {
            **os.environ,
            "REPRO_PROXY_BIND": f"{HOST}:{self.port}",
            "REPRO_API_1": self.replicas[0],
            "REPRO_API_2": self.replicas[1],
        }
        with open(self.log, "wb") as out:
            self._proc = subprocess.Popen(
                [need_haproxy(), "-W", "-db", "-f", str(CONFIG)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(self._proc.pid)],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + _START_SECONDS
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/proxy-health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"HAProxy did not come up:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(timeout=20)
        if self._watchdog is not None and self._watchdog.stdin is not None:
            with contextlib.suppress(OSError):
                self._watchdog.stdin.write(b"stopped")
                self._watchdog.stdin.close()
            self._watchdog.wait(timeout=20)
