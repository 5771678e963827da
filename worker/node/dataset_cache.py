"""The node's dataset cache: each dataset downloaded once, by digest, verified before each use.

Files live in `<work-dir>/datasets/<hex digest>`. A download goes to a temporary file that
is renamed into place only once its SHA-256 equals the digest, so a crash never leaves a
half file under a digest's name. Before each job the cached file is hashed again: a file
damaged on disk (or by anything else) is discarded and fetched again, never handed to a
job. Cached files are read-only (0444) in an owner-only directory: a container job running
as another user can read the one file bind-mounted into it, and nothing else here.

A compressed dataset may take far more memory than its file: before a job starts, the
arrays' inflated size (from their headers, nothing inflated) is checked against the memory
a job has here, and a dataset that cannot fit fails the run with both numbers instead of
the job dying of an out-of-memory kill. TensorFlow-free.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path

from worker.data.dataset_format import declared_bytes
from worker.node.client import ApiClient, file_sha256

log = logging.getLogger("reprotrain.agent")
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
READ_ONLY = 0o444
# The memory a job may use on this node, as Docker writes it (`8g`, `512m`, bytes); unset:
# the job container's `--memory` for the Docker executor, else the memory the host has free.
MEMORY_VARIABLE = "REPRO_WORKER_JOB_MEMORY"
_SIZE = re.compile(r"^\s*(\d+)\s*([bkmg]?)b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


class DatasetCacheError(ValueError):
    """A digest this cache cannot hold (not `sha256:<64 hex>`)."""


class DatasetTooLargeForMemory(ValueError):
    """The dataset's arrays take more memory, once inflated, than a job has on this node."""


def memory_size(text: str) -> int:
    """Bytes of a memory size written as Docker does (`8g`, `512m`, `1024k`, `4096`)."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"not a memory size: {text!r} (write it as 8g, 512m or bytes)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def _host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def job_memory(executor_limit: str | None = None) -> tuple[int | None, str]:
    """(bytes a job may use here, where that figure comes from): `REPRO_WORKER_JOB_MEMORY`,
    else the executor's memory limit (Docker's `--memory`), else the host's free memory."""
    configured = os.environ.get(MEMORY_VARIABLE, "").strip()
    if configured:
        return memory_size(configured), MEMORY_VARIABLE
    if executor_limit:
        return memory_size(executor_limit), "the job container's --memory"
    return _host_available_bytes(), "the memory this host has available"


class DatasetCache:
    """Datasets by digest in one directory, fetched through the API on first use."""

    def __init__(
        self,
        directory: Path,
        client: ApiClient,
        *,
        memory: tuple[int | None, str] = (None, "no bound"),
    ) -> None:
        self.directory = directory
        self.client = client
        self.memory = memory  # (bytes a job may use, where that figure comes from)
        self.downloads = 0  # how many times a file was fetched (a cache hit fetches nothing)
        self._lock = threading.Lock()

    def path(self, digest: str) -> Path:
        """Where the dataset of `digest` is kept (the name is the hex digest)."""
        match = _DIGEST.match(digest)
        if match is None:  # the digest becomes a file name
            raise DatasetCacheError(f"not a dataset digest: {digest!r}")
        return self.directory / match.group(1)

    def fetch(self, digest: str) -> Path:
        """The local file of `digest`, its bytes verified now; downloaded when missing or
        damaged. ApiError when the API cannot or will not give it; DatasetTooLargeForMemory
        when its arrays, inflated, need more than the memory a job has here."""
        path = self._fetch(digest)
        self._check_fits(digest, path)
        return path

    def _check_fits(self, digest: str, path: Path) -> None:
        limit, source = self.memory
        if limit is None:
            return
        needed = declared_bytes(path)
        if needed > limit:
            raise DatasetTooLargeForMemory(
                f"dataset {digest} takes {needed} bytes once inflated, more than the {limit} "
                f"bytes a job may use on this worker ({source}); run it on a worker with more "
                f"memory or set {MEMORY_VARIABLE}"
            )

    def _fetch(self, digest: str) -> Path:
        path = self.path(digest)
        with self._lock:
            if path.exists():
                actual = "sha256:" + file_sha256(path)[0]
                if actual == digest:
                    return path
                log.warning(
                    "cached dataset %s is damaged (its bytes hash to %s); fetching it again",
                    digest,
                    actual,
                )
                path.unlink()
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.client.download_dataset(digest, path)  # renamed into place once verified
            os.chmod(path, READ_ONLY)
            self.downloads += 1
            log.info("dataset %s fetched (%d bytes)", digest, path.stat().st_size)
            return path
