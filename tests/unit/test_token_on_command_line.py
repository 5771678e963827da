"""Tokens stay off the command line: /proc/<pid>/cmdline is readable by every local user.

`repro worker --token T` is refused (the agent lives for days, and its jobs run beside it);
the short-lived client commands warn. `--token-file` (or REPRO_TOKEN_FILE) reads the token
from an owner-only file; a worker started that way registers and trains in every
integration test that starts one (tests/integration/service_procs.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli.output import TokenFileError, token_from
from tests.cli_runner import repro

NOWHERE = "http://127.0.0.1:9"  # nothing listens there: a command that gets past its
# options fails to connect, which is how these tests tell "refused" from "started"


def test_worker_refuses_a_token_on_its_command_line(tmp_path: Path) -> None:
    done = repro("worker", "--api", NOWHERE, "--token", "rpt_9_secret", "--work-dir", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--token-file" in done.stderr and "process list" in done.stderr
    assert not (tmp_path / "outbox").exists()  # refused before the agent set anything up


def test_worker_refuses_an_unreadable_token_file(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-token"
    done = repro("worker", "--api", NOWHERE, "--token-file", str(missing), timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot read the token file" in done.stderr and str(missing) in done.stderr


def test_client_commands_warn_about_a_token_on_the_command_line(tmp_path: Path) -> None:
    done = repro("status", "1", "--api", NOWHERE, "--token", "rpt_9_secret")
    assert "readable by every local user" in done.stderr, done.stderr
    token = tmp_path / "token"
    token.write_text("rpt_9_secret\n")
    done = repro("status", "1", "--api", NOWHERE, "--token-file", str(token))
    assert "readable by every local user" not in done.stderr
    assert "cannot reach the API" in done.stderr  # it went on to use the token


def test_token_file_is_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("rpt_3_abc\n")
    assert token_from(None, path) == "rpt_3_abc"
    assert token_from("rpt_1_env", None) == "rpt_1_env"
    with pytest.raises(TokenFileError, match="give the token once"):
        token_from("rpt_1_env", path)
    path.write_text("  \n")
    with pytest.raises(TokenFileError, match="is empty"):
        token_from(None, path)
    path.write_text("rpt_3_abc\nrpt_4_def\n")
    with pytest.raises(TokenFileError, match="more than one token line"):
        token_from(None, path)
