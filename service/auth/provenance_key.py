"""The key jobs digest environment values with, and what a claim tells the job about it.

Every worker's jobs use the service's key, so the digests of two runs on different workers
compare. The key is the configured one, else `provenance.key` in the data directory,
created owner-only on first use: the file a local run (`repro run`) on the same machine
and data directory uses too.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from service.config import Settings
from service.persistence.file_modes import private_dir, tighten_existing
from worker.record.environment_capture import KEY_FILE, read_or_create_key


@functools.cache
def _key_of(configured: str, data_dir: Path) -> str:
    if configured:
        return configured
    private_dir(data_dir)
    path = data_dir / KEY_FILE
    key = read_or_create_key(path).decode("utf-8")
    tighten_existing(path)
    return key


def provenance_key(settings: Settings) -> str:
    """The key, read (or created) once per process and data directory."""
    return _key_of(settings.provenance_key, settings.data_dir)


def claim_provenance(settings: Settings) -> dict[str, Any]:
    """What a claimed job needs to record its environment: the key and the numerics list."""
    names = [n for n in settings.numeric_env_vars.split(",") if n]
    return {"key": provenance_key(settings), "numeric_env_vars": names}
