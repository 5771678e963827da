"""A throwaway PostgreSQL server for tests, started in a temporary directory.

Tests that need PostgreSQL get a real server that they start themselves (never a system
service), so the suite behaves the same on a laptop, a developer machine and CI. One server
per pytest process (`postgres_server`), one fresh database per test (`postgres_url`).
"""

from __future__ import annotations

import atexit
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
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType

import psycopg
import pytest
from psycopg import sql

from tests.ports import free_port
from tests.postgres_binaries import (
    SERVER_USER,
    find_bindir,
    postgres_unavailable_reason,
    running_as_root,
)

HOST = "127.0.0.1"

# Durability is worthless for a database that is deleted after the run; turning it off
# makes DDL-heavy tests several times faster. max_connections leaves room for the
# concurrency tests' worker processes and their pools.
DEFAULT_SETTINGS: dict[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}

_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_LOG_TAIL_LINES = 40

# Runs in its own session so that Ctrl-C and the test run's process group being killed do
# not reach it: when the test process dies without calling stop() (SIGKILL, SIGTERM, a
# crash), the pipe closes and this stops the server and deletes its directory.
_WATCHDOG = """
import json, shutil, subprocess, sys
stop_cmd, base = json.loads(sys.argv[1])
if sys.stdin.buffer.read() != b"stopped":
    try:
        subprocess.run(stop_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60, cwd=base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
"""


def _conf_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _world_traversable(path: Path) -> bool:
    # The server user must be able to reach its directory through every parent.
    for part in [path, *path.parents]:
        try:
            if not part.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _tail(path: Path, start: int = 0) -> str:
    try:
        with path.open("rb") as log:
            log.seek(start)
            lines = log.read().decode(errors="replace").splitlines()
    except OSError as exc:
        return f"(no server log: {exc})"
    return "\n".join(lines[-_LOG_TAIL_LINES:])


class PostgresServer:
    """A private PostgreSQL server in a temporary directory, listening on 127.0.0.1.

    Superuser `postgres`, trust authentication, a free port picked at start. stop() kills the
    server and deletes the directory; an atexit hook and a watchdog process do the same if
    the test run ends without calling it.
    """

    host = HOST

    def __init__(self, settings: Mapping[str, str] | None = None) -> None:
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.port: int | None = None
        self.base_dir: Path | None = None
        self.startup_seconds: float | None = None
        self._bindir: Path | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._owner_pid: int | None = None
        self._running = False

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> PostgresServer:
        if self.base_dir is not None:
            raise RuntimeError("PostgresServer is already started")
        reason = postgres_unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self._bindir = find_bindir()
        began = time.monotonic()
        self._owner_pid = os.getpid()
        self.base_dir = self._make_base_dir()
        atexit.register(self.stop)
        try:
            self._start_watchdog()
            self._initdb()
            self._write_settings()
            self._start_server()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        # A forked child (multiprocessing) inherits this object and the atexit hook; only
        # the process that started the server may stop it.
        if self.base_dir is None or os.getpid() != self._owner_pid:
            return
        base = self.base_dir
        try:
            if self._running:
                result = self._pg_ctl("-m", "immediate", "-w", "-t", "30", "stop", timeout=60)
                if result.returncode != 0 and self._pid_file_exists():
                    self._kill_postmaster(result.stdout)
        finally:
            self._running = False
            shutil.rmtree(base, ignore_errors=True)
            self.base_dir = None
            self.port = None
            self._stop_watchdog()
            atexit.unregister(self.stop)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- URLs and databases ----------------------------------------------------------------

    def url_for(self, database: str) -> str:
        """The SQLAlchemy URL (psycopg 3 driver) of a database on this server."""
        return f"postgresql+psycopg://{SERVER_USER}@{self.host}:{self._require_port()}/{database}"

    @property
    def admin_url(self) -> str:
        return self.url_for("postgres")

    def connect_admin(self) -> psycopg.Connection[tuple[object, ...]]:
        """An autocommit superuser connection to the `postgres` database."""
        return psycopg.connect(
            host=self.host,
            port=self._require_port(),
            user=SERVER_USER,
            dbname="postgres",
            autocommit=True,
            connect_timeout=10,
        )

    def create_database(self, name: str) -> str:
        """Create an empty database and return its SQLAlchemy URL."""
        if not _DB_NAME.fullmatch(name):
            raise ValueError(f"database name must match {_DB_NAME.pattern}: {name!r}")
        with self.connect_admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, first ending any sessions a test left connected to it."""
        with self.connect_admin() as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            # FORCE (PostgreSQL 13+) also covers a session that connects between the two
            # statements; DROP DATABASE itself waits a few seconds for terminated backends.
            force = sql.SQL(" WITH (FORCE)") if conn.info.server_version >= 130000 else sql.SQL("")
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {}{}").format(sql.Identifier(name), force)
            )

    # -- internals -------------------------------------------------------------------------

    @property
    def _data_dir(self) -> Path:
        assert self.base_dir is not None
        return self.base_dir / "data"

    @property
    def _socket_dir(self) -> Path:
        assert self.base_dir is not None
        return self.base_dir / "sock"

    @property
    def _log_file(self) -> Path:
        assert self.base_dir is not None
        return self.base_dir / "server.log"

    def _require_port(self) -> int:
        if self.port is None:
            raise RuntimeError("PostgresServer is not running")
        return self.port

    def _bin(self, name: str) -> str:
        assert self._bindir is not None
        return str(self._bindir / name)

    def _pid_file_exists(self) -> bool:
        return (self._data_dir / "postmaster.pid").exists()

    @property
    def postmaster_pid(self) -> int:
        """The running server's process id, from its pid file (OSError, ValueError or
        IndexError without one)."""
        return int((self._data_dir / "postmaster.pid").read_text().splitlines()[0])

    def _kill_postmaster(self, pg_ctl_output: str) -> None:
        # Deleting the directory under a live server would leave it running unseen.
        try:
            os.kill(self.postmaster_pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError) as exc:
            raise RuntimeError(
                f"could not stop PostgreSQL server ({exc}); pg_ctl said:\n{pg_ctl_output}"
            ) from exc

    def _as_server_user(self, cmd: list[str]) -> list[str]:
        if running_as_root():
            return ["runuser", "-u", SERVER_USER, "--", *cmd]
        return cmd

    def _env(self) -> dict[str, str]:
        # PGDATA, PGPORT and friends from the developer's shell must not redirect pg_ctl.
        return {key: value for key, value in os.environ.items() if not key.startswith("PG")}

    def _run(self, cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self._as_server_user(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=timeout,
            env=self._env(),
            cwd=self.base_dir,
            check=False,
        )

    def _pg_ctl(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return self._run([self._bin("pg_ctl"), "-D", str(self._data_dir), *args], timeout)

    def _make_base_dir(self) -> Path:
        parent = Path(tempfile.gettempdir())
        if running_as_root() and not _world_traversable(parent):
            parent = Path("/tmp")
        base = Path(tempfile.mkdtemp(prefix="reprotrain-pg-", dir=parent))
        (base / "sock").mkdir(mode=0o700)
        if running_as_root():
            import pwd

            entry = pwd.getpwnam(SERVER_USER)
            for path in (base, base / "sock"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        return base

    def _start_watchdog(self) -> None:
        stop_cmd = self._as_server_user(
            [self._bin("pg_ctl"), "-D", str(self._data_dir), "-m", "immediate", "stop"]
        )
        self._watchdog = subprocess.Popen(
            [sys.executable, "-I", "-c", _WATCHDOG, json.dumps([stop_cmd, str(self.base_dir)])],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=self._env(),
        )

    def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is None:
            return
        assert watchdog.stdin is not None
        with contextlib.suppress(OSError):
            watchdog.stdin.write(b"stopped")
        with contextlib.suppress(OSError):
            watchdog.stdin.close()
        try:
            watchdog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            watchdog.kill()
            watchdog.wait()

    def _initdb(self) -> None:
        initdb = [self._bin("initdb"), "-D", str(self._data_dir), "-A", "trust"]
        result = self._run(
            [*initdb, "-U", SERVER_USER, "-E", "UTF8", "--locale=C", "--no-sync"], timeout=120
        )
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed ({result.returncode}):\n{result.stdout}")

    def _write_settings(self) -> None:
        settings = {
            **self.settings,
            "listen_addresses": _conf_quote(HOST),
            "unix_socket_directories": _conf_quote(str(self._socket_dir)),
        }
        lines = [f"{key} = {value}" for key, value in settings.items()]
        with (self._data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# reprotrain test server\n" + "\n".join(lines) + "\n")

    def _start_server(self) -> None:
        attempts = 3
        for attempt in range(1, attempts + 1):
            port = free_port()
            log_start = self._log_file.stat().st_size if self._log_file.exists() else 0
            result = self._pg_ctl(
                "-l", str(self._log_file), "-o", f"-p {port}", "-w", "-t", "60", "start", timeout=90
            )
            if result.returncode == 0:
                self.port = port
                self._running = True
                return
            log = _tail(self._log_file, log_start)
            # Another process can take the port between free_port() and the bind.
            if "Address already in use" in log and attempt < attempts:
                continue
            # pg_ctl may have timed out with the postmaster still coming up.
            self._running = self._pid_file_exists()
            raise RuntimeError(
                f"PostgreSQL server failed to start (pg_ctl exit {result.returncode}):\n"
                f"{result.stdout.rstrip()}\n--- server log (tail) ---\n{log}"
            )


# -- pytest fixtures ---------------------------------------------------------------------------

_database_counter = itertools.count(1)


def database_name(test_name: str, number: int) -> str:
    """A valid, unique-per-run database name derived from a test's name."""
    stem = re.sub(r"[^a-z0-9_]+", "_", test_name.lower()).strip("_")[:48] or "test"
    return f"t_{stem}_{number}"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One private PostgreSQL server for the whole test session; skipped if unavailable."""
    reason = postgres_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """SQLAlchemy URL of a fresh, empty database for this test, dropped afterwards."""
    name = database_name(request.node.name, next(_database_counter))
    url = postgres_server.create_database(name)
    yield url
    postgres_server.drop_database(name)
