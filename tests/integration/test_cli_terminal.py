"""The `repro` command line on a terminal (a pseudo-terminal of a set size), against a real
server: `submit --wait` shows the epochs advance out of the run's total, and a table keeps its
digests whole when they fit and tells its rows apart when they do not."""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cli_runner import repro, repro_command
from tests.integration.jobs import blobs_spec, job_env, write_spec
from tests.integration.service_procs import Service, running

# Colours, and the cursor moves and returns with which a terminal program redraws a line:
# the text between two of those is what a person saw at some moment.
_COLOUR = re.compile(r"\x1b\[[0-9;]*m|\x1b\][^\x07]*\x07")
_REDRAW = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


def on_terminal(*args: str, columns: int, cwd: Path, timeout: float = 300) -> tuple[int, str]:
    """`repro ARGS` with stdout and stderr on a terminal `columns` wide: its exit code and
    everything it wrote, control sequences removed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in job_env().items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(COLUMNS=str(columns), LINES="40", TERM="xterm-256color")
    proc = subprocess.Popen(
        repro_command(*args),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        cwd=cwd,
        env=env,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1.0)[0]:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the program exited and closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        else:
            raise TimeoutError(f"repro {' '.join(args)} still running after {timeout} s")
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    return code, _REDRAW.sub("\n", _COLOUR.sub("", text))


@pytest.mark.slow
def test_submit_wait_on_a_terminal_shows_epochs_of_the_total_and_final_metrics(
    tmp_path: Path,
) -> None:
    service = Service(tmp_path / "data", extra=("--no-demo",))
    with running(service, tmp_path / "worker") as (svc, _):
        # Epochs long enough (a few seconds) for the worker's reports to land in each.
        tiny = blobs_spec()
        tiny["dataset"]["train_batches"] = 3000
        tiny["training"]["epochs"] = 3
        spec = write_spec(tiny, tmp_path)
        api = ("--api", svc.url, "--token", svc.admin_token)
        code, shown = on_terminal("submit", str(spec), "--wait", *api, columns=120, cwd=tmp_path)
        assert code == 0, shown
        assert "0/?" not in shown, shown
        assert "3/3" in shown and ("1/3" in shown or "2/3" in shown), shown
        final = [line for line in shown.splitlines() if line.startswith("epoch 3 ")]
        assert final and "loss " in final[-1] and "accuracy " in final[-1], shown


def _npz_sharing_a_prefix(hex_digits: int) -> tuple[bytes, bytes]:
    """Two small datasets whose SHA-256 digests start with the same `hex_digits` digits."""
    x, y = np.zeros((40, 3), np.float32), np.arange(40) % 2
    seen: dict[str, bytes] = {}
    for i in range(1 << 20):
        x[0, 0] = i
        buffer = io.BytesIO()
        np.savez(buffer, x=x, y=y)
        body = buffer.getvalue()
        start = hashlib.sha256(body).hexdigest()[:hex_digits]
        if start in seen:
            return seen[start], body
        seen[start] = body
    raise AssertionError("no two digests share a prefix")


def _digest_cells(shown: str) -> list[str]:
    """The first cell of each row of the table in `shown`, the header's excepted."""
    cells = [line.split("│")[1].strip() for line in shown.splitlines() if line.startswith("│")]
    return [c for c in cells if c]


def test_dataset_list_on_a_narrow_terminal_tells_digests_apart_and_prints_them_whole_wide(
    tmp_path: Path,
) -> None:
    bodies = _npz_sharing_a_prefix(6)  # "sha256:" and 6 more characters alike
    service = Service(tmp_path / "data", extra=("--no-demo",))
    with running(service) as (svc, _):
        api = ("--api", svc.url, "--token", svc.admin_token)
        digests = []
        for i, body in enumerate(bodies):
            path = tmp_path / f"table-{i}.npz"
            path.write_bytes(body)
            pushed = repro("dataset", "push", str(path), *api, cwd=tmp_path)
            assert pushed.returncode == 0, pushed.stderr
            digests.append(pushed.stdout.strip())
        assert digests[0][:13] == digests[1][:13] and digests[0] != digests[1]

        code, narrow = on_terminal("dataset", "list", *api, columns=60, cwd=tmp_path)
        assert code == 0, narrow
        shown = _digest_cells(narrow)
        assert len(shown) == 2, narrow
        assert all(cell.endswith("…") for cell in shown), narrow  # cut to fit
        # Each shown prefix is one digest's, and each digest is shown once.
        matches = [[d for d in digests if d.startswith(cell[:-1])] for cell in shown]
        assert all(len(m) == 1 for m in matches), narrow
        assert {m[0] for m in matches} == set(digests), narrow

        code, wide = on_terminal("dataset", "list", *api, columns=250, cwd=tmp_path)
        assert code == 0, wide
        assert sorted(_digest_cells(wide)) == sorted(digests), wide

        # Into a pipe: plain columns (no box drawing), whole digests, sizes for people.
        piped = repro("dataset", "list", *api, cwd=tmp_path)
        assert piped.returncode == 0, piped.stderr
        assert not set("│┃━─╭╰") & set(piped.stdout), piped.stdout
        rows = [line.split() for line in piped.stdout.splitlines()[1:] if line.strip()]
        assert sorted(row[0] for row in rows) == sorted(digests), piped.stdout
        assert all(" KiB " in line for line in piped.stdout.splitlines()[1:]), piped.stdout
