"""Where stored bytes live: one interface, two backends.

Every file the server keeps (artifacts, datasets, model definitions, code bundles) is
content-addressed: its place is its SHA-256 within a space, and a row names it by a storage
URL. The embedded default keeps them in the data directory (`file://` URLs); with
`REPRO_STORAGE_URL=s3://bucket/prefix` they live in an S3-compatible store (`s3://` URLs,
see `service.storage.s3_store`), which several API replicas share and which workers reach
through presigned URLs.

Bytes reach their place only once their digest has been checked, so anything a URL names
was verified on the way in; reading it back here checks the digest again.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from starlette.responses import FileResponse, Response

from service.config import Settings
from service.errors import ServiceError
from service.persistence.file_modes import open_private, private_dir


class BlobStore(Protocol):
    """A content-addressed store of verified bytes."""

    def put_file(self, space: str, hexdigest: str, path: Path) -> str:
        """Keep the checked file's bytes under their digest (the file is consumed): its URL."""

    def put_bytes(self, space: str, hexdigest: str, body: bytes) -> str:
        """Keep checked bytes under their digest: their URL."""


def stored_path(directory: Path, hexdigest: str) -> Path:
    """Where the file of `hexdigest` (or `sha256:<hex>`) lives in a local content store."""
    hexdigest = hexdigest.removeprefix("sha256:")
    return directory / hexdigest[:2] / hexdigest


class LocalStore:
    """Files in the data directory, owner-only, moved into place whole."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def directory(self, space: str) -> Path:
        """The folder of one space (artifacts, datasets, models, code): artifacts at the root,
        where they have always been, the others in a folder of their name."""
        return self.root if space == "artifacts" else self.root / space

    def put_file(self, space: str, hexdigest: str, path: Path) -> str:
        final = stored_path(self.directory(space), hexdigest)
        private_dir(final.parent)
        os.replace(path, final)
        return final.resolve().as_uri()

    def put_bytes(self, space: str, hexdigest: str, body: bytes) -> str:
        final = stored_path(self.directory(space), hexdigest)
        private_dir(final.parent)
        tmp = final.parent / f".upload-{secrets.token_hex(8)}.part"
        try:
            with os.fdopen(open_private(tmp), "wb") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return final.resolve().as_uri()


def open_store(settings: Settings) -> BlobStore:
    """The store new bytes go to, per REPRO_STORAGE_URL (the data directory by default)."""
    if settings.storage_url and settings.storage_url.startswith("s3://"):
        from service.storage.s3_store import s3_store

        return s3_store(settings)
    return LocalStore(settings.resolved_artifacts_dir)


def spool_directory(settings: Settings) -> Path:
    """Where uploads are written while their digest is checked, before they go to the store."""
    return settings.resolved_artifacts_dir


def _is_local(url: str) -> bool:
    return url.startswith("file:")


def file_of(url: str) -> Path:
    """The file behind a `file://` storage URL."""
    return Path(unquote(urlparse(url).path))


class StoredBytesUnreadable(OSError):
    """The stored bytes are gone, not their digest, or the store does not answer."""


@contextmanager
def local_copy(
    url: str, sha256: str, *, settings: Settings | None = None, max_bytes: int | None = None
) -> Iterator[Path]:
    """A local file holding the stored bytes, for readers that want a path.

    A local store's own file (reading it fails as files do when it is gone); from an object
    store, a temporary copy whose digest is checked, gone afterwards. Either way what goes
    wrong is an OSError, as it always was for a missing file.
    """
    if _is_local(url):
        yield file_of(url)
        return
    from botocore.exceptions import BotoCoreError, ClientError

    from service.storage.s3_store import store_of

    store = store_of(url, settings)
    tmp = private_dir(store.scratch) / f".read-{secrets.token_hex(8)}"
    try:
        try:
            store.download(url, tmp, sha256=sha256, max_bytes=max_bytes)
        except (ServiceError, BotoCoreError, ClientError) as exc:
            raise StoredBytesUnreadable(f"{url}: {exc}") from exc
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def read_bytes(url: str, sha256: str, *, settings: Settings | None = None) -> bytes:
    """The stored bytes (digest-checked when they come from an object store)."""
    with local_copy(url, sha256, settings=settings) as path:
        return path.read_bytes()


def delete(url: str, *, settings: Settings | None = None) -> None:
    """Remove the stored bytes; nothing when they are already gone."""
    if _is_local(url):
        file_of(url).unlink(missing_ok=True)
        return
    from service.storage.s3_store import store_of

    store_of(url, settings).delete(url)


def download_response(
    url: str,
    *,
    sha256: str,
    filename: str,
    for_worker: bool = False,
    settings: Settings | None = None,
) -> Response:
    """What a download answers: the file itself, or a redirect (307) to a short-lived
    presigned GET of the object (at the store's public address unless `for_worker`); either
    way `X-Content-SHA256` says the digest."""
    headers = {"X-Content-SHA256": sha256, "X-Content-Type-Options": "nosniff"}
    if _is_local(url):
        return FileResponse(
            file_of(url),
            media_type="application/octet-stream",
            headers=headers,
            filename=filename,
        )
    from service.storage.s3_store import store_of

    store = store_of(url, settings)
    location = store.presigned_get(url, filename=filename, for_worker=for_worker)
    return Response(status_code=307, headers={**headers, "Location": location})
