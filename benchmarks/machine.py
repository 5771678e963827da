"""What the benchmarks ran on: cores, memory, CPU model and versions, without TensorFlow."""

from __future__ import annotations

import datetime
import os
import platform
import re
import sqlite3
import subprocess
from importlib import metadata
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(*distributions: str) -> str:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "-"


def _postgres_version() -> str:
    from tests.postgres_binaries import find_bindir

    bindir = find_bindir()
    if bindir is None:
        return "-"
    try:
        out = subprocess.run(
            [str(bindir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except OSError:
        return "-"
    found = re.search(r"\(PostgreSQL\) (\S+)", out)  # "postgres (PostgreSQL) 15.18 (...)"
    return found.group(1) if found else out.strip() or "-"


def machine() -> dict[str, Any]:
    """The machine and software versions, as plain data for the JSON and the README."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "date": datetime.date.today().isoformat(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(memory / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "tensorflow": _version("tensorflow-cpu", "tensorflow"),
        "keras": _version("keras"),
        "numpy": _version("numpy"),
        "blake3": _version("blake3"),
        "sqlite": sqlite3.sqlite_version,
        "postgresql": _postgres_version(),
        "loadavg_start": list(os.getloadavg()),
    }


def describe(env: dict[str, Any]) -> str:
    """One line for people."""
    return (
        f"{env['cpu_count']} cores ({env['cpu_model']}), {env['memory_gib']} GiB, "
        f"Python {env['python']}, TensorFlow {env['tensorflow']}, Keras {env['keras']}, "
        f"NumPy {env['numpy']}, blake3 {env['blake3']}, SQLite {env['sqlite']}, "
        f"PostgreSQL {env['postgresql']}; load average {env['loadavg_start'][0]:.1f}"
        + (f" -> {env['loadavg_end'][0]:.1f}" if "loadavg_end" in env else "")
    )
