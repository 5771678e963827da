"""Suite-wide rules: under CI nothing may be skipped, nothing is written to the home
directory of whoever runs the tests, and a parallel run starts its longest tests first."""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

ROOT = Path(__file__).resolve().parent.parent
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Longest first, so the test processes of a parallel run finish close together instead
    # of one running a ten-minute test at the end; the rest keep their order.
    rank = {nodeid: i for i, nodeid in enumerate(_slow_first())}
    items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Tests one by one, but a module's together where they share a module's fixture."""
    return _ModuleGroups(config, log)


def _slow_first() -> list[str]:
    lines = SLOW_FIRST.read_text().splitlines() if SLOW_FIRST.exists() else []
    return [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]


_SHARED_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*scope=["'](module|class|package)["']""")


@functools.cache
def _shares_a_fixture(module: str) -> bool:
    """Whether a test module defines a fixture built once per module (or class)."""
    path = ROOT / module
    return path.suffix == ".py" and bool(_SHARED_FIXTURE.search(path.read_text()))


class _ModuleGroups(LoadScopeScheduling):
    """A module whose tests share a fixture runs in one test process, so the fixture is built
    once (and a test may count what the others did); every other test is a unit of its own.
    The units go out in collection order, longest first."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if _shares_a_fixture(module) else nodeid
