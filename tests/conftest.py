"""Suite-wide rules: under CI nothing may be skipped, nothing is written to the home
directory of whoever runs the tests, and a parallel run starts its longest tests first."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

SLOW_FIRST = Path(__file__).with_name("slow_first.txt")

_DATA_DIR = "REPRO_DATA_DIR"
# Set beside REPRO_DATA_DIR when the suite made that directory, so the test processes of a
# parallel run (which inherit the environment) each make their own instead of sharing it.
_SUITE_MADE = "REPRO_TESTS_DATA_DIR"
_own_data_dir: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    # Local runs and servers started without a data directory default to ~/.reprotrain
    # (a local run creates its provenance key there): give them one of the session's.
    global _own_data_dir
    inherited = os.environ.get(_SUITE_MADE)
    if _DATA_DIR not in os.environ or (inherited and os.environ[_DATA_DIR] == inherited):
        _own_data_dir = tempfile.mkdtemp(prefix="reprotrain-tests-")
        os.environ[_DATA_DIR] = os.environ[_SUITE_MADE] = _own_data_dir


def pytest_unconfigure(config: pytest.Config) -> None:
    global _own_data_dir
    if _own_data_dir is not None:
        os.environ.pop(_DATA_DIR, None)
        os.environ.pop(_SUITE_MADE, None)
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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Longest first, so the test processes of a parallel run finish close together instead
    # of one running a ten-minute test at the end; the rest keep their order.
    rank = {nodeid: i for i, nodeid in enumerate(_slow_first())}
    items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))
    if getattr(config.option, "dist", "no") == "loadgroup":
        for item in items:
            module = _module_of_shared_fixture(item)
            if module is not None:
                item.add_marker(pytest.mark.xdist_group(module))


def _slow_first() -> list[str]:
    lines = SLOW_FIRST.read_text().splitlines() if SLOW_FIRST.exists() else []
    return [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]


def _module_of_shared_fixture(item: pytest.Item) -> str | None:
    """The test's module when it uses a fixture built once per module (or class): those
    tests run in one test process, so the fixture is built once, not once in each."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for definitions in info.name2fixturedefs.values():
        if definitions and definitions[-1].scope in ("module", "class", "package"):
            return item.nodeid.split("::", 1)[0]
    return None
