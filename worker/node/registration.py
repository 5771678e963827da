"""What a worker agent tells the API of itself when it registers: its executor, images,
devices, hardware class and pool; it refuses to register without the GPUs it expects."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from worker.node.executors import Executor
from worker.record import hardware
from worker.record.gpu_info import gpu_devices


class GpusMissing(Exception):
    """The node shows fewer GPUs than the agent was told to expect (REPRO_EXPECT_GPUS)."""


EXPECT_GPUS = "REPRO_EXPECT_GPUS"
POOL = "REPRO_WORKER_POOL"


def expected_gpus(environ: Mapping[str, str], found: int) -> None:
    """GpusMissing when `environ` expects more GPUs than were `found`: a pod scheduled for
    GPUs that sees none (no NVIDIA runtime, a CDI cluster) must not train GPU runs on its CPU."""
    text = (environ.get(EXPECT_GPUS) or "").strip()
    if not text:
        return
    if not text.isdigit():
        raise GpusMissing(f"{EXPECT_GPUS} must be a whole number of GPUs, not {text!r}")
    if found < int(text):
        raise GpusMissing(
            f"{EXPECT_GPUS}={text}, but the CUDA driver shows {found} GPU(s) here: the "
            "container has no GPU runtime (set runtimeClassName: nvidia, or the NVIDIA "
            "container toolkit), or the GPUs were not granted; not registering, so no GPU "
            "run trains on this CPU"
        )


def registration(executor: Executor, *, images: Sequence[str], cpu_replicas: int) -> dict[str, Any]:
    """The registration's fields for this machine; GpusMissing if GPUs expected are not here."""
    gpus = gpu_devices()
    expected_gpus(os.environ, len(gpus))
    return {
        "executors": [executor.kind],
        "images": list(dict.fromkeys([*executor.advertised_images(), *images])),
        "gpu": gpus[0].get("name") if gpus else None,
        "hostname": socket.gethostname(),
        "gpus": len(gpus),
        "cpu_devices": None if gpus else cpu_replicas,
        "accepts_code": bool(getattr(executor, "accepts_code", False)),
        "hardware_class": hardware.this_machine(gpus)["class"],
        "pool": os.environ.get(POOL) or None,
    }
