"""What the client raises: the API's refusals with their status and reason, an API that
cannot be reached, a spec file that cannot be read, and a wait that ran out of time."""

from __future__ import annotations

from typing import Any


class ReproError(Exception):
    """Anything the client raises on purpose."""


class InsecureTransportWarning(UserWarning):
    """A token is about to be sent in clear text (plain http:// to another machine)."""


class ApiError(ReproError):
    """The API answered with an error: `status_code`, its `reason`, and the per-field
    `errors` ({"loc", "msg"}) where it listed them."""

    def __init__(
        self,
        status_code: int | None,
        detail: Any,
        *,
        errors: list[Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status_code, detail)
        self.status_code = status_code
        self.detail = detail  # the answer's `detail` as sent (usually a string)
        self.errors = errors or []
        self.retry_after = retry_after  # seconds the server asked to wait, if it said

    @property
    def reason(self) -> str:
        """The API's reason as one line of text."""
        return self.detail if isinstance(self.detail, str) else repr(self.detail)

    def __str__(self) -> str:
        prefix = f"HTTP {self.status_code}" if self.status_code is not None else "no answer"
        return f"{prefix}: {self.reason}"


class Unreachable(ApiError):
    """No answer from the API (connection refused, timed out, broke off), after retries."""

    def __init__(self, detail: str) -> None:
        super().__init__(None, detail)


class SpecFileError(ReproError, ValueError):
    """A spec file that cannot be read or parsed; the message names the file."""


class WaitTimeout(ReproError, TimeoutError):
    """A run (or audit, or refinement) did not finish within the time given to wait."""
