"""What the API client raises (read from the API's error answers), and the file digest it
sends with uploads."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx

_CHUNK = 1 << 20


class ApiError(Exception):
    """The API answered with an error."""

    def __init__(
        self,
        status_code: int | None,
        detail: Any,
        retry_after: float | None = None,
        errors: list[Any] | None = None,
    ) -> None:
        super().__init__(status_code, detail)
        self.status_code = status_code
        self.detail = detail
        self.retry_after = retry_after  # seconds the server asked us to wait (Retry-After)
        self.errors = errors or []  # the answer's field errors ({"loc", "msg"}), if it had any

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later: no answer, 408, 429 or a 5xx."""
        code = self.status_code
        return code is None or code in (408, 429) or code >= 500

    def __str__(self) -> str:
        prefix = f"HTTP {self.status_code}" if self.status_code is not None else type(self).__name__
        return f"{prefix}: {self.detail}"


class LeaseLost(ApiError):
    """The worker no longer holds the run (its lease expired or the run was cancelled)."""


class ApiUnreachable(ApiError):
    """The API could not be reached (no HTTP response, after retries)."""


class ArtifactCorrupt(ApiError):
    """A downloaded artifact does not match its expected SHA-256."""


def file_sha256(path: Path) -> tuple[str, int]:
    """Hex SHA-256 and size in bytes of a file, read in blocks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def _detail(response: httpx.Response) -> tuple[Any, list[Any]]:
    """The answer's reason, and its field errors where it lists them."""
    try:
        body = response.json()
    except ValueError:
        return response.text or response.reason_phrase, []
    if not isinstance(body, dict):
        return body, []
    errors = body.get("errors")
    return body.get("detail", body), errors if isinstance(errors, list) else []


def _retry_after(response: httpx.Response) -> float | None:
    # Only the delay-seconds form: the API never sends an HTTP date.
    try:
        return max(float(response.headers.get("Retry-After", "")), 0.0)
    except ValueError:
        return None


class StoreRefused(ApiError):
    """The object store refused a presigned request; a new ticket may succeed (an expired
    URL answers 403), so those are tried again like the API's own 5xx."""

    @property
    def retryable(self) -> bool:
        code = self.status_code
        return code is None or code in (403, 408, 429) or code >= 500


def error_from(response: httpx.Response, *, lease: bool) -> ApiError:
    """The error of a non-2xx answer (LeaseLost for a 409 to a report about a held run)."""
    cls = LeaseLost if lease and response.status_code == 409 else ApiError
    detail, errors = _detail(response)
    return cls(response.status_code, detail, _retry_after(response), errors)
