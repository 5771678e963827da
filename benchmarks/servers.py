"""Real API servers for the service benchmarks, on SQLite or a private PostgreSQL server.

Everything listens on 127.0.0.1 only and is stopped, and its directory deleted, when the
`with` block ends, also on Ctrl-C or SIGTERM (see `stop_on_sigterm`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the tests' server helpers live in the checkout
    sys.path.insert(0, str(REPO))

DATABASES = ("sqlite", "postgresql")
DATABASE_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """Make SIGTERM unwind like Ctrl-C, so every `with` block cleans up after itself."""
    signal.signal(signal.SIGTERM, _terminate)


@dataclass
class Server:
    service: Any  # tests.integration.service_procs.Service, ready, with the admin token
    database: str  # "sqlite" or "postgresql"
    database_url: str  # for filling the database directly
    workdir: Path
    database_pid: int | None = None  # a PostgreSQL server's postmaster

    @property
    def url(self) -> str:
        return str(self.service.url)

    def token(self, role: str, name: str = "bench") -> str:
        return str(self.service.token(role, name))


@contextmanager
def api_server(
    database: str, workdir: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """A ready `repro serve --no-demo` on a fresh, migrated database (`env`: settings)."""
    from tests.integration.service_procs import Service
    from tests.postgres import PostgresServer

    with ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-api-")))
        database_pid = None
        if database == "postgresql":
            postgres = stack.enter_context(PostgresServer())
            database_url = postgres.create_database("bench")
            database_pid = postgres.postmaster_pid
        elif database == "sqlite":
            database_url = f"sqlite:///{workdir / 'bench.db'}"
        else:
            raise ValueError(f"unknown database {database!r}; known: {', '.join(DATABASES)}")
        service = Service(
            workdir / "data", database_url=database_url, extra=("--no-demo",), env=env
        )
        stack.callback(service.stop)
        service.wait_ready()
        yield Server(service, database, database_url, workdir, database_pid)


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) of a process and of its children, live and ended (Linux):
    for a PostgreSQL postmaster, the work of every backend."""
    ticks, found = 0, False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if stat.parent.name == str(pid):  # itself, and the children it has reaped
            ticks += sum(int(f) for f in fields[11:15])
            found = True
        elif fields[1] == str(pid):  # a live child
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK") if found else None


@contextmanager
def worker_agent(server: Server, work_dir: Path, name: str = "bench") -> Iterator[Any]:
    """`repro worker` with its defaults (claims wait on the server), as an operator starts it."""
    from tests.integration.jobs import job_env

    work_dir.mkdir(parents=True, exist_ok=True)
    with open(work_dir / "agent.log", "w") as log:
        token_file = work_dir / "worker-token"
        token_file.write_text(server.token("worker", name))
        token_file.chmod(0o600)
        args = ["worker", "--api", server.url, "--token-file", str(token_file), "--name", name]
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", *args, "--work-dir", str(work_dir)],
            env=job_env(),
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
