"""The README's first command: `repro serve --with-worker` shows a verified rerun, keeps serving."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.jobs import job_env
from tests.ports import free_port

pytestmark = pytest.mark.slow


def test_first_start_prints_identical_verdict_then_keeps_serving(tmp_path: Path) -> None:
    port = free_port()
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service.cli",
            "serve",
            "--with-worker",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        stdout = proc.stdout
        assert stdout is not None
        lines: queue.Queue[str] = queue.Queue()

        def read() -> None:
            for line in stdout:
                lines.put(line)

        # A reader thread, so a demo that never prints its verdict fails at the deadline
        # instead of blocking the test on a server that keeps serving.
        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + 300
        verdict_line = ""
        while not ("rerun of run" in verdict_line and "verdict" in verdict_line):
            try:
                verdict_line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                proc.kill()
                pytest.fail("no verdict line within 300 s of the first start")
        assert "rerun of run 1: verdict identical  blake3:" in verdict_line, verdict_line
        # Its last line sends a person to the dashboard's page of the pair, not to JSON.
        see = ""
        while "demo: see" not in see:
            see = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
        assert f"http://127.0.0.1:{port}/compare?a=1&b=2 in the dashboard" in see, see
        # Still serving after the demo: the API answers and shows the two runs.
        token = (tmp_path / "data" / "admin-token").read_text().strip()
        assert (tmp_path / "data" / "admin-token").stat().st_mode & 0o777 == 0o600
        runs = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/runs",
            timeout=10,
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        assert [r["status"] for r in runs["items"]] == ["succeeded", "succeeded"]
        assert runs["items"][0]["verdict"] == "identical"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
