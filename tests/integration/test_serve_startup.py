"""`repro serve` at start: who migrates the database, and where the admin login link goes.

The one-time link logs whoever opens it in as admin, so it is printed on a terminal (the
quick start's experience) and on request, never into the logs of a pod or a compose service.
"""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from tests.cli_runner import repro_command
from tests.integration.jobs import job_env
from tests.ports import free_port

LINK = re.compile(r"dashboard: http://127\.0\.0\.1:\d+/login\?code=\S+")
ANNOUNCED = "dashboard:"  # the last line of the start-up announcement, link or not


class _Serve:
    """`repro serve` with its stderr on a terminal of its own or on a plain pipe."""

    def __init__(self, data_dir: Path, *args: str, tty: bool, database_url: str | None = None):
        cmd = ["serve", "--port", str(free_port()), "--data-dir", str(data_dir), "--no-demo"]
        if database_url:
            cmd += ["--database-url", database_url]
        self.output = ""
        self._lock = threading.Lock()
        if tty:
            master, slave = pty.openpty()
            stderr: int = slave
            self._source = master
        else:
            read_end, stderr = os.pipe()
            self._source = read_end
        self.proc = subprocess.Popen(
            repro_command(*cmd, *args),
            env=job_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        os.close(stderr)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._source, 4096)
            except OSError:  # a terminal's reading end says EIO once the other end closes
                break
            if not chunk:
                break
            with self._lock:
                self.output += chunk.decode("utf-8", "replace")
        os.close(self._source)

    def text(self) -> str:
        with self._lock:
            return self.output

    def wait_for(self, needle: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                time.sleep(0.3)  # the rest of that line
                return self.text()
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no {needle!r} (exit {self.proc.poll()}): {self.text()[-3000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self._reader.join(timeout=10)
        return code


def test_login_link_on_a_terminal_only_or_when_asked(tmp_path: Path) -> None:
    on_terminal = _Serve(tmp_path / "tty", tty=True)
    try:
        assert LINK.search(on_terminal.wait_for(ANNOUNCED)), on_terminal.text()
    finally:
        on_terminal.stop()

    # As a pod or a compose service runs it: stderr goes to a log collector.
    in_logs = _Serve(tmp_path / "logs", tty=False)
    try:
        text = in_logs.wait_for(ANNOUNCED)
        assert not LINK.search(text) and "login?code=" not in text, text
        assert "--print-login-link" in text  # says how to get one
    finally:
        in_logs.stop()

    asked = _Serve(tmp_path / "asked", "--print-login-link", tty=False)
    try:
        assert LINK.search(asked.wait_for(ANNOUNCED)), asked.text()
    finally:
        asked.stop()

    refused = _Serve(tmp_path / "refused", "--no-print-login-link", tty=True)
    try:
        assert "login?code=" not in refused.wait_for(ANNOUNCED)
    finally:
        refused.stop()


def test_no_migrate_refuses_an_unmigrated_database_and_serves_a_migrated_one(
    tmp_path: Path, database_url: str | None
) -> None:
    data_dir = tmp_path / "data"
    early = _Serve(data_dir, "--no-migrate", tty=False, database_url=database_url)
    assert early.proc.wait(timeout=90) == 2
    early.stop()
    assert "not migrated" in early.text() and "repro db upgrade" in early.text(), early.text()

    url = ["--database-url", database_url] if database_url else []
    upgraded = subprocess.run(
        repro_command("db", "upgrade", "--data-dir", str(data_dir), *url),
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert upgraded.returncode == 0, upgraded.stderr

    served = _Serve(data_dir, "--no-migrate", tty=False, database_url=database_url)
    try:
        assert "Reprotrain API on" in served.wait_for(ANNOUNCED)
    finally:
        assert served.stop() == 0
