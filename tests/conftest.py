"""Suite-wide rules: under CI nothing may be skipped."""

from __future__ import annotations

import os

import pytest


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
