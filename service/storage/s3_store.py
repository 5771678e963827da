"""The object-store backend: bytes in any S3-compatible store, through boto3.

Objects are named `<prefix>/<space>/<hex[:2]>/<hex>` by their SHA-256, and every write
carries `x-amz-checksum-sha256`, so the store itself refuses bytes that are not the digest.
A worker's upload goes to a presigned PUT of a staging object of its own
(`<prefix>/uploads/run-<id>/<random>`), signed for its digest and length; the server checks
the staged object (the store's SHA-256, or the bytes themselves where a store keeps none)
before copying it to its digest's name, inside the store. Downloads redirect to presigned
GETs. Endpoint and credentials are boto3's own settings (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, AWS_ENDPOINT_URL), or REPRO_S3_ENDPOINT_URL.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import logging
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

from service.config import Settings, get_settings
from service.errors import BodyTooLarge, DigestMismatch, NotFound, StoreUnavailable

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
# A staged upload untouched this long belongs to a worker that never finished it.
STAGED_MAX_AGE = dt.timedelta(hours=1)
UPLOAD_ID = r"^[0-9a-f]{32}$"


def b64_of(hexdigest: str) -> str:
    """The base64 SHA-256 S3 wants (`x-amz-checksum-sha256`) for a hex digest."""
    return base64.b64encode(bytes.fromhex(hexdigest.removeprefix("sha256:"))).decode()


def hex_of(b64: str) -> str | None:
    """The hex digest of S3's base64 SHA-256; None for anything else (a multipart sum)."""
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


@dataclass(frozen=True)
class Ticket:
    """A presigned upload: PUT the bytes to `url` with `headers`, before `expires_at`."""

    upload_id: str
    url: str
    headers: dict[str, str]
    expires_at: dt.datetime


class S3Store:
    """Objects in one bucket under one prefix."""

    def __init__(self, settings: Settings) -> None:
        import boto3
        from botocore.config import Config

        parsed = urlparse(settings.storage_url or "")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.presign_seconds = settings.s3_presign_seconds
        self.scratch = settings.data_dir / "scratch"
        endpoint = settings.s3_endpoint_url
        style = settings.s3_addressing_style
        if style == "auto":
            style = "path" if endpoint or os.environ.get("AWS_ENDPOINT_URL") else "virtual"
        config = Config(
            signature_version="s3v4",
            s3={"addressing_style": style},
            # Checksums are the ones this module sends (SHA-256), as headers any store reads.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            retries={"max_attempts": 4, "mode": "standard"},
        )
        session = boto3.session.Session()
        self.client: Any = session.client("s3", endpoint_url=endpoint, config=config)
        # Presigned URLs name a host in their signature. Workers reach the store where the
        # API does; people (the dashboard, the CLI) may need another address for it.
        public = settings.s3_public_endpoint_url or endpoint
        self.public_signer: Any = (
            self.client
            if public == endpoint
            else session.client("s3", endpoint_url=public, config=config)
        )

    def __repr__(self) -> str:
        return f"S3Store(s3://{self.bucket}/{self.prefix})"

    # names -------------------------------------------------------------------------------
    def key(self, space: str, hexdigest: str) -> str:
        """The object name of a digest in a space."""
        hexdigest = hexdigest.removeprefix("sha256:")
        return "/".join(p for p in (self.prefix, space, hexdigest[:2], hexdigest) if p)

    def url(self, key: str) -> str:
        """The storage URL rows keep."""
        return f"s3://{self.bucket}/{key}"

    def _staged_key(self, run_id: int, upload_id: str) -> str:
        return "/".join(p for p in (self.prefix, "uploads", f"run-{run_id}", upload_id) if p)

    @staticmethod
    def _parts(url: str) -> tuple[str, str]:
        parsed = urlparse(url)
        return parsed.netloc, parsed.path.lstrip("/")

    # the store ------------------------------------------------------------------------------
    def check_bucket(self) -> None:
        """Create the bucket when it is missing; StoreUnavailable naming why it is unusable."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
                raise StoreUnavailable(f"{self!r}: {exc}") from None
        except BotoCoreError as exc:
            raise StoreUnavailable(f"{self!r}: {exc}") from None
        try:
            self.client.create_bucket(Bucket=self.bucket)
            log.info("created bucket %s", self.bucket)
        except (ClientError, BotoCoreError) as exc:
            raise StoreUnavailable(f"{self!r}: the bucket does not exist ({exc})") from None

    def put_file(self, space: str, hexdigest: str, path: Path) -> str:
        key = self.key(space, hexdigest)
        with open(path, "rb") as body:
            self._put(key, body, hexdigest)
        path.unlink(missing_ok=True)
        return self.url(key)

    def put_bytes(self, space: str, hexdigest: str, body: bytes) -> str:
        key = self.key(space, hexdigest)
        self._put(key, body, hexdigest)
        return self.url(key)

    def _put(self, key: str, body: Any, hexdigest: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(
                Bucket=self.bucket, Key=key, Body=body, ChecksumSHA256=b64_of(hexdigest)
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "BadDigest":
                raise DigestMismatch(
                    f"the store refused {key}: its bytes are not {hexdigest}"
                ) from None
            raise

    def download(self, url: str, dest: Path, *, sha256: str, max_bytes: int | None = None) -> None:
        """Copy the object to `dest` (a new owner-only file); DigestMismatch unless its bytes
        are `sha256`, BodyTooLarge past `max_bytes`, NotFound when it is gone."""
        from botocore.exceptions import ClientError

        from service.persistence.file_modes import open_private

        bucket, key = self._parts(url)
        try:
            got = self.client.get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                raise NotFound(f"the stored object {url} is missing") from None
            raise
        digest, size = hashlib.sha256(), 0
        stream = got["Body"]
        try:
            with os.fdopen(open_private(dest), "wb") as fh:
                for chunk in stream.iter_chunks(_CHUNK):
                    size += len(chunk)
                    if max_bytes is not None and size > max_bytes:
                        raise BodyTooLarge(f"{url} is larger than {max_bytes} bytes")
                    digest.update(chunk)
                    fh.write(chunk)
        finally:
            stream.close()
        expected = sha256.removeprefix("sha256:").lower()
        if digest.hexdigest() != expected:
            dest.unlink(missing_ok=True)
            raise DigestMismatch(f"{url}: {size} bytes with SHA-256 {digest.hexdigest()}")

    def delete(self, url: str) -> None:
        """Remove the object (nothing if it is gone)."""
        bucket, key = self._parts(url)
        self.client.delete_object(Bucket=bucket, Key=key)

    def presigned_get(self, url: str, *, filename: str, for_worker: bool) -> str:
        """A GET of the object that works for `s3_presign_seconds`, saving as `filename`; at
        the public address unless it is for a worker."""
        bucket, key = self._parts(url)
        signer = self.client if for_worker else self.public_signer
        signed: str = signer.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": bucket,
                "Key": key,
                "ResponseContentDisposition": f"attachment; filename*=UTF-8''{quote(filename)}",
                "ResponseContentType": "application/octet-stream",
            },
            ExpiresIn=self.presign_seconds,
        )
        return signed

    # presigned uploads -----------------------------------------------------------------------
    def presigned_put(self, run_id: int, *, sha256: str, size: int) -> Ticket:
        """A PUT of exactly `size` bytes whose SHA-256 is `sha256`, to a new staging object."""
        upload_id = secrets.token_hex(16)
        checksum = b64_of(sha256)
        url = self.client.generate_presigned_url(
            "put_object",
            Params={
                "Bucket": self.bucket,
                "Key": self._staged_key(run_id, upload_id),
                "ChecksumSHA256": checksum,
                "ContentLength": size,
            },
            ExpiresIn=self.presign_seconds,
        )
        expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.presign_seconds)
        headers = {"x-amz-checksum-sha256": checksum, "Content-Length": str(size)}
        return Ticket(upload_id=upload_id, url=url, headers=headers, expires_at=expires)

    def adopt(self, run_id: int, upload_id: str, *, space: str, sha256: str, size: int) -> str:
        """Check the staged upload is `size` bytes of `sha256` and give it its digest's name
        (a copy inside the store): its URL. NotFound when nothing was staged; DigestMismatch,
        the staged object removed, when it is other bytes."""
        from botocore.exceptions import ClientError

        staged = self._staged_key(run_id, upload_id)
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=staged, ChecksumMode="ENABLED")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise NotFound(f"upload {upload_id} of run {run_id} holds no bytes") from None
            raise
        try:
            self._check_staged(staged, head, sha256=sha256, size=size)
            key = self.key(space, sha256)
            self.client.copy_object(
                Bucket=self.bucket, Key=key, CopySource={"Bucket": self.bucket, "Key": staged}
            )
        finally:
            self.client.delete_object(Bucket=self.bucket, Key=staged)
        return self.url(key)

    def _check_staged(self, staged: str, head: dict[str, Any], *, sha256: str, size: int) -> None:
        if head.get("ContentLength") != size:
            raise DigestMismatch(
                f"the upload holds {head.get('ContentLength')} bytes, not the declared {size}; "
                "nothing was stored"
            )
        stored = hex_of(head.get("ChecksumSHA256") or "")
        if stored is None:  # a store that keeps no SHA-256: read the bytes once here
            private = self.scratch
            private.mkdir(parents=True, exist_ok=True)
            tmp = private / f".staged-{secrets.token_hex(8)}"
            try:
                self.download(self.url(staged), tmp, sha256=sha256, max_bytes=size)
            finally:
                tmp.unlink(missing_ok=True)
            return
        if stored != sha256:
            raise DigestMismatch(
                f"the upload's SHA-256 is {stored}, not the declared {sha256}; nothing was stored"
            )

    def sweep_staged(self, *, older_than: dt.timedelta = STAGED_MAX_AGE) -> int:
        """Remove staged uploads nobody finished within `older_than`; how many went."""
        cutoff = dt.datetime.now(dt.UTC) - older_than
        prefix = "/".join(p for p in (self.prefix, "uploads") if p) + "/"
        removed = 0
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        for page in pages:
            for obj in page.get("Contents", []):
                if obj["LastModified"] < cutoff:
                    self.client.delete_object(Bucket=self.bucket, Key=obj["Key"])
                    removed += 1
        if removed:
            log.info("removed %d upload(s) that workers staged and never finished", removed)
        return removed


_stores: dict[tuple[object, ...], S3Store] = {}
_stores_lock = threading.Lock()


def s3_store(settings: Settings) -> S3Store:
    """The object store the settings name (one client per configuration, kept)."""
    key = (
        settings.storage_url,
        settings.s3_endpoint_url,
        settings.s3_public_endpoint_url,
        settings.s3_addressing_style,
        settings.s3_presign_seconds,
        settings.data_dir,
    )
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = S3Store(settings)
            _by_bucket[store.bucket] = store
        return store


_by_bucket: dict[str, S3Store] = {}


def store_of(url: str, settings: Settings | None = None) -> S3Store:
    """The store holding an `s3://` URL: the one `settings` name, else the one this process
    opened for its bucket (the app's, at start), else the process-wide settings'."""
    if settings is not None:
        return s3_store(settings)
    with _stores_lock:
        found = _by_bucket.get(urlparse(url).netloc)
    return found if found is not None else s3_store(get_settings())
