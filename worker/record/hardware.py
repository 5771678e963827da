"""The hardware class of a machine: what decides which kernels run and in which order they
reduce, so two runs of one class can be bitwise equal and two of different classes may not.

A class is written general to specific, segments joined by ':', so that a requirement is
any leading part of it: `gpu`, `gpu:nvidia-h100-80gb-hbm3`, ... up to the whole class.

- GPU: `gpu:<product>:sm<SMs>:<memory>gb:<MIG profile or full>:drv<driver major>` from
  device 0 (SMs and memory as the driver reports them, so a MIG slice is its own class).
- CPU: `cpu:<vendor>:<model>:<ISA level>`, the ISA level being the widest oneDNN can use
  here (or the cap `ONEDNN_MAX_CPU_ISA` puts on it): it picks oneDNN's kernels.

Pure functions of the facts given, so they are tested with the strings real systems print.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MAX_CLASS_CHARS = 300
# What a requirement may be: lowercase segments of letters, digits, '.', '-', joined by ':'.
REQUIREMENT_PATTERN = r"^(gpu|cpu)(:[a-z0-9][a-z0-9.-]*)*$"
CPUINFO = Path("/proc/cpuinfo")
DRIVER_FILES = (Path("/proc/driver/nvidia/version"), Path("/sys/module/nvidia/version"))

# oneDNN's ISA names, widest first, with the cpuinfo flags each needs.
_ISA_LEVELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("avx512_core_amx", ("amx_tile", "amx_bf16", "amx_int8", "avx512f", "avx512bw")),
    ("avx512_core_bf16", ("avx512_bf16", "avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("avx512_core_vnni", ("avx512_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("avx512_core", ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("avx2_vnni", ("avx_vnni", "avx2")),
    ("avx2", ("avx2",)),
    ("avx", ("avx",)),
    ("sse41", ("sse4_1",)),
)
ISA_NAMES = tuple(name for name, _ in _ISA_LEVELS)  # widest first
_ISA_ORDER = list(ISA_NAMES)
_MIG = re.compile(r"\bMIG\s+(\d+g\.\d+gb)\b", re.IGNORECASE)


def slug(text: str) -> str:
    """`text` as one class segment: lowercase letters, digits and '.', the rest '-'."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.") or "unknown"


def matches(requirement: str | None, hardware_class: str | None) -> bool:
    """Whether a worker of `hardware_class` may take a run requiring `requirement` (None:
    any): the class is the requirement or starts with it and a ':'."""
    if not requirement:
        return True
    if not hardware_class:
        return False
    return hardware_class == requirement or hardware_class.startswith(requirement + ":")


def driver_major(version_text: str | None) -> int | None:
    """The NVIDIA driver's major version from /proc/driver/nvidia/version ("NVRM version:
    NVIDIA UNIX x86_64 Kernel Module  555.42.02  ...") or /sys/module/nvidia/version
    ("555.42.02")."""
    found = re.search(r"(?<![\d.])(\d{3,4})\.\d+(?:\.\d+)?\b", version_text or "")
    return int(found.group(1)) if found else None


def read_driver_version() -> str | None:
    """The kernel module's version text, where the node shows it."""
    for path in DRIVER_FILES:
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
    return None


def gpu_class(device: Mapping[str, Any], *, driver_text: str | None) -> dict[str, Any]:
    """The class of a GPU as `gpu_info.gpu_devices()` describes it (name, sm_count,
    memory_bytes): its parts and the class string."""
    name = str(device.get("name") or "unknown")
    mig = _MIG.search(name)
    product = _MIG.sub("", name).strip() if mig else name
    memory = device.get("memory_bytes")
    gib = round(memory / 2**30) if isinstance(memory, int) and memory > 0 else None
    parts = {
        "kind": "gpu",
        "product": product,
        "sm_count": device.get("sm_count"),
        "memory_gib": gib,
        "mig_profile": mig.group(1).lower() if mig else None,
        "driver_major": driver_major(driver_text),
    }
    segments: list[str] = [
        "gpu",
        slug(product),
        f"sm{parts['sm_count'] if parts['sm_count'] is not None else 'unknown'}",
        f"{gib}gb" if gib is not None else "unknown",
        str(parts["mig_profile"] or "full"),
        f"drv{parts['driver_major']}" if parts["driver_major"] is not None else "drvunknown",
    ]
    return {**parts, "class": ":".join(segments)[:MAX_CLASS_CHARS]}


def cpu_facts(cpuinfo_text: str) -> dict[str, Any]:
    """Vendor, model name and flags from /proc/cpuinfo text (x86; ARM names its implementer
    and "Features" instead)."""
    vendor = model = None
    flags: set[str] = set()
    for line in cpuinfo_text.splitlines():
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if not sep:
            continue
        if vendor is None and key in ("vendor_id", "CPU implementer"):
            vendor = value
        elif model is None and key in ("model name", "Model", "cpu model"):
            model = value
        elif not flags and key in ("flags", "Features"):
            flags = set(value.split())
    return {"vendor": vendor, "model": model, "flags": flags}


def isa_level(flags: set[str], cap: str | None = None) -> str:
    """The widest oneDNN ISA the flags allow, no wider than `cap` (ONEDNN_MAX_CPU_ISA, as
    oneDNN spells it, any case); "baseline" when none is known (e.g. ARM)."""
    level = next((name for name, needs in _ISA_LEVELS if set(needs) <= flags), "baseline")
    wanted = (cap or "").strip().lower()
    if wanted == "all" or wanted not in _ISA_ORDER or level not in _ISA_ORDER:
        return level
    return _ISA_ORDER[max(_ISA_ORDER.index(level), _ISA_ORDER.index(wanted))]


def cpu_class(cpuinfo_text: str, *, isa_cap: str | None) -> dict[str, Any]:
    """The class of this CPU: its parts and the class string."""
    facts = cpu_facts(cpuinfo_text)
    level = isa_level(facts["flags"], isa_cap)
    vendor, model = facts["vendor"] or "unknown", facts["model"] or "unknown"
    segments = ["cpu", slug(vendor), slug(model), slug(level)]
    return {
        "kind": "cpu",
        "vendor": vendor,
        "model": model,
        "isa": level,
        "class": ":".join(segments)[:MAX_CLASS_CHARS],
    }


def hardware_class(
    gpus: Sequence[Mapping[str, Any]],
    *,
    cpuinfo_text: str,
    driver_text: str | None,
    environ: Mapping[str, str],
) -> dict[str, Any]:
    """This machine's class: its first GPU's, else its CPU's. GPUs of more than one class
    on one machine are said (`mixed`): a job may land on any of them."""
    if not gpus:
        return cpu_class(cpuinfo_text, isa_cap=environ.get("ONEDNN_MAX_CPU_ISA"))
    found = gpu_class(gpus[0], driver_text=driver_text)
    others = {gpu_class(g, driver_text=driver_text)["class"] for g in gpus[1:]}
    if others - {found["class"]}:
        found["mixed"] = sorted(others | {found["class"]})
    return found


def read_cpuinfo() -> str:
    """This machine's /proc/cpuinfo ("" where there is none)."""
    try:
        return CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def this_machine(gpus: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The class of the machine this runs on, given its GPUs (`gpu_info.gpu_devices()`)."""
    driver = read_driver_version() if gpus else None
    return hardware_class(gpus, cpuinfo_text=read_cpuinfo(), driver_text=driver, environ=os.environ)
