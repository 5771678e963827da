"""The GPU acceptance suite: every test here is marked `gpu`, which the test command
deselects. Run it on a machine with a CUDA GPU: `pytest -n 0 -m gpu tests/gpu`.

Without a GPU the tests fail, never skip: a suite that passed without running would say
nothing about GPUs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from worker.record.gpu_info import gpu_devices

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def gpu() -> dict[str, Any]:
    """The first GPU the driver lists; fails the test on a machine without one."""
    devices = gpu_devices()
    assert devices, "no CUDA GPU is visible to the driver: run the gpu suite on a GPU machine"
    return devices[0]
