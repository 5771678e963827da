"""Which GPUs `nvidia-smi -L` lists, and which of them can each hold a replica.

A GPU in MIG mode is listed with its MIG devices under it. A CUDA process enumerates at
most one MIG device, so only whole GPUs (no MIG devices) can give one job two replicas.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

LIST_COMMAND = ("nvidia-smi", "-L")
# What nvidia-smi prints instead of a list on a machine whose driver has no GPU.
NO_DEVICES = "No devices were found"

_GPU_LINE = re.compile(r"^GPU (?P<index>\d+): (?P<name>.+?) \(UUID: (?P<uuid>GPU-[0-9A-Za-z-]+)\)$")
# `MIG 1g.5gb Device 0: (UUID: MIG-...)`; drivers before R470 named a MIG device
# `MIG-GPU-<uuid>/<gi>/<ci>`.
_MIG_LINE = re.compile(
    r"^MIG (?P<profile>\S+)\s+Device\s+(?P<index>\d+): \(UUID: (?P<uuid>MIG-[0-9A-Za-z/-]+)\)$"
)


@dataclass(frozen=True)
class MigDevice:
    profile: str
    index: int
    uuid: str


@dataclass(frozen=True)
class ListedGpu:
    index: int
    name: str
    uuid: str
    mig_devices: tuple[MigDevice, ...] = ()


def parse_gpu_list(text: str) -> list[ListedGpu]:
    """The GPUs of `nvidia-smi -L` output, each with its MIG devices, in listed order.

    ValueError names a line that is neither a GPU nor a MIG device (a MIG device before
    any GPU included): a listing this cannot read must not pass for fewer GPUs.
    """
    gpus: list[ListedGpu] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line == NO_DEVICES:
            continue
        if gpu := _GPU_LINE.match(line):
            gpus.append(ListedGpu(int(gpu["index"]), gpu["name"], gpu["uuid"]))
            continue
        mig = _MIG_LINE.match(line)
        if mig is None or not gpus or not raw[:1].isspace():
            raise ValueError(f"not a line of `nvidia-smi -L`: {raw!r}")
        owner = gpus[-1]
        device = MigDevice(mig["profile"], int(mig["index"]), mig["uuid"])
        gpus[-1] = ListedGpu(owner.index, owner.name, owner.uuid, (*owner.mig_devices, device))
    return gpus


def whole_gpus(gpus: Sequence[ListedGpu]) -> list[ListedGpu]:
    """The GPUs not split into MIG devices: those a job can use several of."""
    return [gpu for gpu in gpus if not gpu.mig_devices]


def visible_devices(gpus: Sequence[ListedGpu]) -> str:
    """A CUDA_VISIBLE_DEVICES value naming exactly these GPUs, by UUID: nvidia-smi numbers
    GPUs in PCI order, CUDA by default fastest first, so an index could name another GPU."""
    if not gpus:
        raise ValueError("no GPU to make visible")
    return ",".join(gpu.uuid for gpu in gpus)


def describe(gpus: Sequence[ListedGpu]) -> str:
    """The listing in one line, for a skip or failure message."""
    if not gpus:
        return "no GPU"
    shown = []
    for gpu in gpus:
        split = f" split into {len(gpu.mig_devices)} MIG device(s)" if gpu.mig_devices else ""
        shown.append(f"GPU {gpu.index} ({gpu.name}){split}")
    whole = len(whole_gpus(gpus))
    return f"{whole} whole GPU(s): " + "; ".join(shown)


def list_gpus(command: Sequence[str] = LIST_COMMAND, *, timeout: float = 60) -> list[ListedGpu]:
    """The GPUs `nvidia-smi -L` lists here; RuntimeError when it cannot be run or fails."""
    try:
        done = subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise RuntimeError(f"{command[0]} not found: cannot tell how many GPUs there are") from None
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip()
        raise RuntimeError(f"`{' '.join(command)}` exited with {done.returncode}: {said}")
    return parse_gpu_list(done.stdout)
