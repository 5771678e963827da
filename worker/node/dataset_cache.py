"""The node's dataset cache: each dataset downloaded once, by digest, verified before each use.

Files live in `<work-dir>/datasets/<hex digest>`. A download goes to a temporary file that
is renamed into place only once its SHA-256 equals the digest, so a crash never leaves a
half file under a digest's name. Before each job the cached file is hashed again: a file
damaged on disk (or by anything else) is discarded and fetched again, never handed to a
job. Cached files are read-only (0444) in an owner-only directory: a container job running
as another user can read the one file bind-mounted into it, and nothing else here.
TensorFlow-free.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path

from worker.node.client import ApiClient, file_sha256

log = logging.getLogger("reprotrain.agent")
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
READ_ONLY = 0o444


class DatasetCacheError(ValueError):
    """A digest this cache cannot hold (not `sha256:<64 hex>`)."""


class DatasetCache:
    """Datasets by digest in one directory, fetched through the API on first use."""

    def __init__(self, directory: Path, client: ApiClient) -> None:
        self.directory = directory
        self.client = client
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
        damaged. ApiError when the API cannot or will not give it."""
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
