"""Suite-wide rules: under CI nothing may be skipped, and nothing is written to the home
directory of whoever runs the tests."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_DATA_DIR = "REPRO_DATA_DIR"
_own_data_dir: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    # Local runs and servers started without a data directory default to ~/.reprotrain
    # (a local run creates its provenance key there): give them one of the session's.
    global _own_data_dir
    if _DATA_DIR not in os.environ:
        _own_data_dir = tempfile.mkdtemp(prefix="reprotrain-tests-")
        os.environ[_DATA_DIR] = _own_data_dir


def pytest_unconfigure(config: pytest.Config) -> None:
    global _own_data_dir
    if _own_data_dir is not None:
        os.environ.pop(_DATA_DIR, None)
        shutil.rmtree(_own_data_dir, ignore_errors=True)
        _own_data_dir = None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        reporter.write_line(
            f"CI: {len(skipped)} test(s) skipped; under CI every test must run", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
