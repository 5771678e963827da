"""The GPU acceptance suite: every test here is marked `gpu`, which the test command
deselects. Run it on a machine with a CUDA GPU: `pytest -n 0 -m gpu tests/gpu`.

Without a GPU the tests fail, never skip: a suite that passed without running would say
nothing about GPUs. Only the tests of two GPUs skip, naming what `nvidia-smi -L` listed,
on a machine with one (under CI, tests/conftest.py fails any run that skipped a test).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gpu.nvidia_smi import describe, list_gpus, visible_devices, whole_gpus
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


@pytest.fixture(scope="session")
def two_gpus(gpu: dict[str, Any]) -> str:
    """CUDA_VISIBLE_DEVICES naming two whole GPUs (no MIG devices) by UUID; skips the test
    on a machine with fewer, fails it where `nvidia-smi -L` cannot be run or read."""
    listed = list_gpus()
    whole = whole_gpus(listed)
    if len(whole) < 2:
        pytest.skip(f"two replicas need two whole GPUs; nvidia-smi -L lists {describe(listed)}")
    return visible_devices(whole[:2])
