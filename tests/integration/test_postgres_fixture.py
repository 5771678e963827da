"""The PostgreSQL test fixtures themselves: isolation, row claiming, concurrency, cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

# postgres_server and postgres_url come from tests/integration/conftest.py; importing them
# here as well would register a second session fixture and start a second server.
from tests.postgres import PostgresServer, database_name
from tests.postgres_binaries import postgres_unavailable_reason

REPO = Path(__file__).resolve().parents[2]
SEEN_DATABASES: list[str] = []
# For tests that start servers of their own rather than use the session's.
_UNAVAILABLE = postgres_unavailable_reason()
needs_postgres = pytest.mark.skipif(_UNAVAILABLE is not None, reason=_UNAVAILABLE or "")


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Engine]:
    eng = sa.create_engine(postgres_url, pool_size=60, max_overflow=0)
    try:
        yield eng
    finally:
        eng.dispose()


def _user_tables(conn: sa.Connection) -> list[str]:
    rows = conn.execute(
        sa.text(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
        )
    )
    return sorted(rows.scalars())


def _server_alive(port: int) -> bool:
    try:
        psycopg.connect(host="127.0.0.1", port=port, user="postgres", connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_an_empty_private_database(engine: Engine, run: int) -> None:
    # Both runs create the same table; whichever runs second would fail here if databases
    # were shared or not fresh.
    assert engine.url.database is not None
    assert engine.url.database not in SEEN_DATABASES
    SEEN_DATABASES.append(engine.url.database)
    with engine.begin() as conn:
        assert _user_tables(conn) == []
        conn.execute(sa.text("CREATE TABLE isolation_probe (run int)"))
        conn.execute(sa.text("INSERT INTO isolation_probe VALUES (:run)"), {"run": run})
        assert _user_tables(conn) == ["isolation_probe"]


def test_fixture_urls_point_at_the_private_server(
    postgres_server: PostgresServer,
    postgres_url: str,
) -> None:
    url = make_url(postgres_url)
    assert url.drivername == "postgresql+psycopg"
    assert (url.host, url.port, url.username) == ("127.0.0.1", postgres_server.port, "postgres")
    assert postgres_server.admin_url.endswith(f":{postgres_server.port}/postgres")
    eng = sa.create_engine(postgres_url)
    try:
        with eng.connect() as conn:
            assert conn.execute(sa.text("SELECT current_database()")).scalar() == url.database
    finally:
        eng.dispose()


def test_drop_database_ends_lingering_sessions(postgres_server: PostgresServer) -> None:
    url = postgres_server.create_database("t_lingering")
    lingering = sa.create_engine(url)
    conn = lingering.connect()
    conn.execute(sa.text("SELECT 1"))
    try:
        postgres_server.drop_database("t_lingering")
        with postgres_server.connect_admin() as admin:
            exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = 't_lingering'")
            assert exists.fetchone() is None
    finally:
        conn.invalidate()
        lingering.dispose()


def test_database_names_are_valid_for_any_test_name() -> None:
    name = database_name("test_thing[Case A-1/ünïcode]" + "x" * 100, 12345)
    assert name.startswith("t_test_thing_case_a_1_")
    assert name.endswith("_12345")
    assert len(name) <= 63


def test_skip_locked_claims_different_rows(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE jobs (id int PRIMARY KEY, state text NOT NULL)"))
        conn.execute(sa.text("INSERT INTO jobs VALUES (1, 'queued'), (2, 'queued')"))
    claim = sa.text(
        "SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
    )
    with engine.connect() as first, engine.connect() as second:
        # A blocking wait instead of a skip must fail the test, not hang it.
        second.execute(sa.text("SET lock_timeout = '2s'"))
        assert first.execute(claim).scalar() == 1
        assert second.execute(claim).scalar() == 2
        # With both rows locked, a third claim finds nothing rather than waiting.
        with engine.connect() as third:
            third.execute(sa.text("SET lock_timeout = '2s'"))
            assert third.execute(claim).scalar() is None
            third.rollback()
        # Without SKIP LOCKED the same row really is locked.
        with engine.connect() as fourth, pytest.raises(sa.exc.OperationalError) as err:
            fourth.execute(sa.text("SELECT id FROM jobs WHERE id = 1 FOR UPDATE NOWAIT"))
        assert isinstance(err.value.orig, psycopg.errors.LockNotAvailable)
        first.execute(sa.text("UPDATE jobs SET state = 'running' WHERE id = 1"))
        first.commit()
        second.rollback()
        # Row 2's claim was rolled back, so it is claimable again; row 1 is no longer queued.
        assert second.execute(claim).scalar() == 2
        second.rollback()


def test_skip_locked_hands_each_row_to_exactly_one_of_many_workers(engine: Engine) -> None:
    rows, workers = 60, 8
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE jobs (id int PRIMARY KEY, claimed_by int)"))
        conn.execute(
            sa.text("INSERT INTO jobs SELECT g, NULL FROM generate_series(1, :n) g"), {"n": rows}
        )
    start = threading.Barrier(workers)

    def work(worker: int) -> list[int]:
        claimed: list[int] = []
        start.wait()
        while True:
            with engine.begin() as conn:
                conn.execute(sa.text("SET LOCAL lock_timeout = '5s'"))
                job = conn.execute(
                    sa.text(
                        "SELECT id FROM jobs WHERE claimed_by IS NULL ORDER BY id LIMIT 1"
                        " FOR UPDATE SKIP LOCKED"
                    )
                ).scalar()
                if job is None:
                    return claimed
                conn.execute(
                    sa.text("UPDATE jobs SET claimed_by = :w WHERE id = :id"),
                    {"w": worker, "id": job},
                )
                claimed.append(job)

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(work, range(workers)))
    counts = Counter(job for claimed in results for job in claimed)
    assert sorted(counts) == list(range(1, rows + 1))
    assert set(counts.values()) == {1}
    with engine.connect() as conn:
        assert (
            conn.execute(sa.text("SELECT count(*) FROM jobs WHERE claimed_by IS NULL")).scalar()
            == 0
        )


def test_server_survives_fifty_concurrent_connections(engine: Engine) -> None:
    clients = 50
    together = threading.Barrier(clients)

    def client(_: int) -> int:
        with engine.connect() as conn:
            # Every connection is open at once before any of them runs its query.
            together.wait(timeout=30)
            conn.execute(sa.text("SELECT pg_sleep(0.2)"))
            return int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())

    with ThreadPoolExecutor(clients) as pool:
        pids = list(pool.map(client, range(clients)))
    assert len(set(pids)) == clients
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1
        assert int(conn.execute(sa.text("SHOW max_connections")).scalar_one()) >= 200


@needs_postgres
def test_stop_kills_the_server_and_deletes_its_directory() -> None:
    server = PostgresServer().start()
    port, base = server.port, server.base_dir
    assert port is not None and base is not None
    assert _server_alive(port)
    server.stop()
    assert not base.exists()
    assert not _server_alive(port)
    server.stop()  # idempotent


@needs_postgres
def test_failed_start_reports_the_server_log_and_cleans_up() -> None:
    server = PostgresServer(settings={"shared_buffers": "'not a size'"})
    with pytest.raises(RuntimeError, match="server failed to start") as err:
        server.start()
    assert "shared_buffers" in str(err.value)  # the log tail names the bad setting
    assert server.base_dir is None
    assert server.port is None


@needs_postgres
def test_killed_test_process_leaves_no_server_behind() -> None:
    script = textwrap.dedent(
        """
        import json, os, signal
        from tests.postgres import PostgresServer
        server = PostgresServer().start()
        print(json.dumps([server.port, str(server.base_dir)]), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    port, base = json.loads(proc.stdout)
    deadline = time.monotonic() + 30
    while (Path(base).exists() or _server_alive(port)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _server_alive(port)
    assert not Path(base).exists()
