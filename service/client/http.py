"""The HTTP side of the client: one connection pool, timeouts, and bounded retries that
never repeat an action the server may have taken."""

from __future__ import annotations

import email.utils
import ipaddress
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx

from .errors import ApiError, InsecureTransportWarning, Unreachable

PREFIX = "/api/v1"
# 429: throttled; 503: overloaded or not ready. 502 and 504: a proxy lost the server.
RETRY_STATUSES = frozenset({429, 502, 503, 504})


def carries_tokens_safely(url: str) -> bool:
    """Whether a token sent to `url` stays off the network: https, or http to this machine."""
    return httpx.URL(url).scheme != "http" or is_this_machine(url)


def is_this_machine(url: str) -> bool:
    """Whether `url` names this machine (localhost, a loopback address)."""
    host = httpx.URL(url).host
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def retry_after(response: httpx.Response) -> float | None:
    """The seconds a Retry-After header asks for (delay-seconds or an HTTP date)."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


def error_from(response: httpx.Response) -> ApiError:
    """The ApiError of a non-2xx answer: its reason and field errors, as the API sent them."""
    try:
        body = response.json()
    except ValueError:
        body = response.text or response.reason_phrase
    detail: Any = body
    errors: list[Any] = []
    if isinstance(body, dict):
        detail = body.get("detail", body)
        found = body.get("errors")
        errors = found if isinstance(found, list) else []
    return ApiError(response.status_code, detail, errors=errors, retry_after=retry_after(response))


class Http:
    """Requests to one API with a bearer token, timeouts and retries.

    Every request may be retried when the connection was never made (the server cannot have
    acted). Idempotent ones are also retried after a timeout, a broken connection, or a 429,
    502, 503 or 504 answer, waiting what Retry-After asks (else backing off), at most
    `retries` times; an answer asking to wait longer than `max_retry_wait` is raised at once.
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float,
        retries: int,
        backoff: float,
        max_retry_wait: float,
        transport: httpx.BaseTransport | None = None,
        token_origin: str | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        # Where the token came from, for the one error a person must act on: 401.
        self.token_origin = token_origin if token else None
        if token and not carries_tokens_safely(self.url):
            warnings.warn(
                f"{self.url} is plain http to another machine: the API token travels in clear "
                "text; use https:// (a TLS-terminating proxy in front of the API)",
                InsecureTransportWarning,
                stacklevel=3,
            )
        self.retries = retries
        self.backoff = backoff
        self.max_retry_wait = max_retry_wait
        self.http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def timeout(self, *, read: float | None) -> httpx.Timeout:
        """The client's timeouts with another read timeout (None: as long as it takes)."""
        base = self.http.timeout
        return httpx.Timeout(connect=base.connect, read=read, write=base.write, pool=base.pool)

    def send(
        self, build: Callable[[], httpx.Request], *, idempotent: bool, stream: bool = False
    ) -> httpx.Response:
        """Send the request `build` makes (afresh for each attempt); ApiError unless 2xx."""
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            wait = self.backoff * 2**attempt
            try:
                response = self.http.send(build(), stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if last:
                    raise Unreachable(f"cannot reach {self.url}: {exc}") from exc
            except httpx.TransportError as exc:
                if last or not idempotent:
                    raise Unreachable(f"{self.url}: {exc!r}") from exc
            else:
                if response.is_success:
                    return response
                response.read()
                response.close()
                error = error_from(response)
                if response.status_code == 401:
                    error = self._unauthorized(error)
                asked = error.retry_after
                if (
                    last
                    or not idempotent
                    or response.status_code not in RETRY_STATUSES
                    or (asked is not None and asked > self.max_retry_wait)
                ):
                    raise error
                wait = wait if asked is None else asked
            time.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _unauthorized(self, error: ApiError) -> ApiError:
        """A 401 that says which token was refused, or that none was sent, and where one
        comes from."""
        said = error.detail if isinstance(error.detail, str) else "not authenticated"
        sent = (
            f"the token from {self.token_origin} was refused"
            if self.token_origin
            else "no token was sent"
        )
        where = (
            "a token comes from Client(token=...), REPRO_TOKEN, or on the machine that runs "
            "`repro serve` from its admin token file (REPRO_DATA_DIR, default ~/.reprotrain, "
            "/admin-token); an admin makes more with `repro token create`"
        )
        return ApiError(401, f"{said}: {sent}; {where}", errors=error.errors)

    def call(
        self, method: str, path: str, *, idempotent: bool | None = None, **kwargs: Any
    ) -> httpx.Response:
        """One API request; GETs count as idempotent unless told otherwise."""
        safe = method == "GET" if idempotent is None else idempotent
        url = PREFIX + path
        return self.send(lambda: self.http.build_request(method, url, **kwargs), idempotent=safe)

    def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """One API request's JSON object ({} for an empty answer)."""
        response = self.call(method, path, **kwargs)
        if not response.content:
            return {}
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ApiError(response.status_code, f"expected a JSON object: {response.text[:200]}")
        return body

    @contextmanager
    def lines(self, path: str, *, read: float | None) -> Iterator[Iterator[str] | None]:
        """The lines of a streamed answer (server-sent events), or None if it is refused."""
        with self.http.stream("GET", PREFIX + path, timeout=self.timeout(read=read)) as answer:
            yield answer.iter_lines() if answer.is_success else None
