"""The HTTP side of the API client: one connection pool, retries that cannot repeat an
action on the server, request bodies streamed from files, downloads that appear only once
their digest matches."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from worker.node.api_errors import (
    ApiError,
    ApiUnreachable,
    ArtifactCorrupt,
    StoreRefused,
    error_from,
)

API = "/api/v1"
_RETRY_STATUSES = frozenset({502, 503, 504})
_CHUNK = 1 << 20


def as_dict(response: httpx.Response) -> dict[str, Any]:
    """A 2xx response's JSON object ({} for an empty body); ApiError for anything else."""
    if not response.content:  # 204 or an empty 2xx body: nothing more to report
        return {}
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ApiError(response.status_code, f"expected a JSON object, got {response.text[:200]!r}")
    return body


class Transport:
    """A connection to the API: the base of `ApiClient`, which adds one method per endpoint."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        retries: int = 3,
        backoff: float = 0.25,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        # Set from the registration's answer: files go to the object store by presigned URL.
        self.presigned_uploads = False
        self.backoff = backoff
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )
        # The object store's presigned URLs carry their own signature: requests to them never
        # carry the API token.
        self._store = httpx.Client(timeout=timeout, transport=transport)

    def close(self) -> None:
        """Close the connection pools."""
        self._http.close()
        self._store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(
        self,
        build: Callable[[], httpx.Request],
        *,
        idempotent: bool,
        lease: bool = False,
        stream: bool = False,
    ) -> httpx.Response:
        """Send with retries; idempotent requests also retry timeouts and 502/503/504.

        Non-idempotent ones retry only when the connection was never made, because then the
        server cannot have acted on them.
        """
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._http.send(build(), stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if last:
                    raise ApiUnreachable(None, f"cannot reach {self.base_url}: {exc}") from exc
            except httpx.TransportError as exc:
                if last or not idempotent:
                    raise ApiUnreachable(None, f"{self.base_url}: {exc!r}") from exc
            else:
                if response.is_success or (stream and response.status_code == 307):
                    return response
                response.read()
                response.close()
                if not (idempotent and response.status_code in _RETRY_STATUSES and not last):
                    raise error_from(response, lease=lease)
            time.sleep(self.backoff * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop always returns/raises

    def _send_to_store(self, build: Callable[[], httpx.Request]) -> httpx.Response:
        """A request to a presigned URL of the object store, retried like an idempotent one
        (a PUT of the same bytes to the same object is); ApiError with the store's answer."""
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._store.send(build(), stream=True)
            except httpx.TransportError as exc:
                if last:
                    raise ApiUnreachable(None, f"the object store: {exc!r}") from exc
            else:
                if response.is_success:
                    return response
                response.read()
                response.close()
                if response.status_code not in _RETRY_STATUSES or last:
                    raise StoreRefused(
                        response.status_code, f"the object store: {response.text[:300]}"
                    )
            time.sleep(self.backoff * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop always returns/raises

    def _timeout(self, *, read: float | None) -> httpx.Timeout:
        """The client's timeouts with another read timeout (None: wait as long as it takes)."""
        base = self._http.timeout
        return httpx.Timeout(connect=base.connect, read=read, write=base.write, pool=base.pool)

    def _call(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool | None = None,
        lease: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        safe = method == "GET" if idempotent is None else idempotent
        return self._send(
            lambda: self._http.build_request(method, path, **kwargs), idempotent=safe, lease=lease
        )

    def _download(self, url: str, dest: Path, *, sha256: str) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part")
        for attempt in range(self.retries + 1):
            try:
                actual = self._download_once(url, tmp)
                break
            except ApiUnreachable:
                tmp.unlink(missing_ok=True)
                if attempt == self.retries:
                    raise
                time.sleep(self.backoff * 2**attempt)
        if actual != sha256.lower():
            tmp.unlink(missing_ok=True)
            raise ArtifactCorrupt(None, f"{url}: sha256 {actual} != {sha256}")
        os.replace(tmp, dest)
        return dest

    def _download_once(self, url: str, tmp: Path) -> str:
        response = self._send(
            lambda: self._http.build_request("GET", url), idempotent=True, stream=True
        )
        if response.status_code == 307:  # the bytes are in the object store: a presigned GET
            response.close()
            location = response.headers.get("location", "")
            response = self._send_to_store(lambda: self._store.build_request("GET", location))
        digest = hashlib.sha256()
        try:
            with open(tmp, "wb") as fh:
                for chunk in response.iter_bytes(_CHUNK):
                    digest.update(chunk)
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
        except httpx.TransportError as exc:  # the connection broke mid-body
            raise ApiUnreachable(None, f"download of {url} broke off: {exc!r}") from exc
        finally:
            response.close()
        return digest.hexdigest()
