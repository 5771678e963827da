"""Half-written uploads a stopped server left behind are removed when the app starts again,
once they are old enough that no upload can still be writing them; nothing else is."""

from __future__ import annotations

import os
import time
from pathlib import Path

from service.app import create_app
from service.config import Settings
from service.persistence.migrate import upgrade
from service.storage.artifacts import PARTIAL_UPLOAD_MAX_AGE_SECONDS


def _file(path: Path, age_seconds: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"partial")
    then = time.time() - age_seconds
    os.utime(path, (then, then))
    return path


def test_old_partial_uploads_go_at_start_and_everything_else_stays(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    upgrade(settings.resolved_database_url)
    old = PARTIAL_UPLOAD_MAX_AGE_SECONDS + 60
    artifacts, datasets = settings.resolved_artifacts_dir, settings.resolved_datasets_dir
    stale = [
        _file(artifacts / ".epoch-000001.npz.4242.140.part", old),
        _file(datasets / ".upload-0123456789abcdef.part", old),
    ]
    kept = [
        _file(artifacts / ".epoch-000002.npz.4242.141.part", 5),  # an upload still arriving
        _file(artifacts / "ab" / ("ab" + "0" * 62), old),  # a stored artifact
        _file(artifacts / "ab" / ".nested.part", old),  # not where uploads are spooled
        _file(datasets / "notes.part", old),  # not a hidden spool file
    ]
    app = create_app(settings)
    try:
        assert [p.exists() for p in stale] == [False, False]
        assert all(p.exists() for p in kept)
    finally:
        app.state.engine.dispose()
