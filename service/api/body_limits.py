"""Request bodies bounded by the bytes actually received, before any route reads them.

A body is refused as it streams in, chunked or not, whatever its `Content-Length` says:
- 401 before a single byte of it is read when an API request carries a body without a
  bearer token of the right shape (the route still verifies the token itself);
- for the routes that take more than `max_body_bytes` (uploads, a worker's result), 401 or
  403 before a byte is read unless the token is valid and its role may use the route: a
  stranger cannot make the server read 64 MiB to learn that their token is wrong;
- 413 as soon as the bytes received pass the route's limit: `max_body_bytes` for JSON,
  `max_artifact_bytes` for uploads, `max_dataset_bytes` for dataset pushes,
  `max_result_bytes` for a worker's result;
- 408 when the body does not arrive within `body_timeout_seconds` of the route starting
  to read it, plus one second per `body_min_bytes_per_second` already received.

Every refusal closes the connection: the rest of the body is never read. So does any other
answer given before the whole body arrived (a 404, 405 or 401 from a route that never
reads it): the connection is never kept for a body nobody reads.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth.tokens import TOKEN_PATTERN as TOKEN_SYNTAX
from service.auth.tokens import Permission
from service.config import Settings
from service.errors import ServiceError

# Routes that stream large bodies to disk under the upload limit; everything else is JSON.
# Dataset pushes stream to disk too, under their own limit.
UPLOAD_ROUTES = (re.compile(r"^/api/v1/runs/[^/]+/artifacts$"),)
DATASET_UPLOAD = re.compile(r"^/api/v1/datasets/?$")  # bounded by max_dataset_bytes
CODE_UPLOAD = re.compile(r"^/api/v1/code/?$")  # bounded by max_code_bundle_bytes
MODEL_UPLOAD = re.compile(r"^/api/v1/models/?$")  # bounded by max_model_definition_bytes
# A worker's result carries the run's fingerprint trace: bounded by max_result_bytes, which
# submit checks every spec's result against.
RESULT_REPORT = re.compile(r"^/api/v1/runs/[^/]+/complete$")
# ... and so does the result a script run by hand reports of itself.
BY_HAND_RESULT = re.compile(r"^/api/v1/runs/[^/]+/result$")
_CLOSE = {"Connection": "close"}


class BodyRefused(HTTPException):
    """A body refused while it streams in; raised from `receive`, answered by the app."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(status_code=status_code, detail=detail, headers=_CLOSE)


def large_body_permission(method: str, path: str) -> Permission | None:
    """The permission a large-body route needs, checked before its body is read; None for
    the routes bounded by `max_body_bytes`, whose routes check it themselves."""
    if method != "POST":
        return None
    if RESULT_REPORT.match(path) or any(p.match(path) for p in UPLOAD_ROUTES):
        return "work"
    if DATASET_UPLOAD.match(path) or CODE_UPLOAD.match(path) or MODEL_UPLOAD.match(path):
        return "submit"
    if BY_HAND_RESULT.match(path):
        return "submit"
    return None


def body_limit(settings: Settings, method: str, path: str) -> int:
    """The most bytes a request body to this route may have."""
    if method == "POST" and any(p.match(path) for p in UPLOAD_ROUTES):
        return settings.max_artifact_bytes
    if method == "POST" and DATASET_UPLOAD.match(path):
        return settings.max_dataset_bytes
    if method == "POST" and CODE_UPLOAD.match(path):
        return settings.max_code_bundle_bytes
    if method == "POST" and MODEL_UPLOAD.match(path):
        return settings.max_model_definition_bytes
    if method == "POST" and (RESULT_REPORT.match(path) or BY_HAND_RESULT.match(path)):
        return max(settings.max_result_bytes, settings.max_body_bytes)
    return settings.max_body_bytes


def _carries_body(headers: Headers) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0") != "0"


def _has_bearer_token(headers: Headers) -> bool:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and TOKEN_SYNTAX.match(token.strip()) is not None


class _BoundedReceive:
    """`receive` that counts body bytes and keeps the body's deadline."""

    def __init__(self, receive: Receive, *, limit: int, settings: Settings) -> None:
        self.receive, self.limit = receive, limit
        self.timeout, self.min_rate = (
            settings.body_timeout_seconds,
            settings.body_min_bytes_per_second,
        )
        self.started: float | None = None  # the clock starts when the app starts reading
        self.received = 0
        self.complete = False

    async def __call__(self) -> Message:
        if self.complete:  # later calls wait for the client to leave: no deadline then
            return await self.receive()
        if self.started is None:
            self.started = time.monotonic()
        left = self.started + self.timeout + self.received / self.min_rate - time.monotonic()
        try:
            async with asyncio.timeout(max(left, 0)):
                message = await self.receive()
        except TimeoutError:
            raise BodyRefused(
                408, f"request body not received in time ({self.received} bytes arrived)"
            ) from None
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                raise BodyRefused(413, f"request body larger than {self.limit} bytes")
            self.complete = not message.get("more_body", False)
        return message


class BodyLimits:
    """ASGI middleware: per-route body limits on received bytes, and no body without a token."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not _carries_body(headers):
            await self.app(scope, receive, send)
            return
        if scope["path"].startswith("/api/") and not _has_bearer_token(headers):
            await reply(
                send,
                401,
                "send a bearer token: Authorization: Bearer <token>",
                {"WWW-Authenticate": "Bearer"},
            )
            return
        permission = large_body_permission(scope["method"], scope["path"])
        if permission is not None and (refused := await _refused_caller(scope, permission)):
            await reply(send, refused.status_code, str(refused), refused_headers(refused))
            return
        limit = body_limit(self.settings, scope["method"], scope["path"])
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await reply(send, 413, f"request body larger than {limit} bytes")
            return
        started = False
        bounded = _BoundedReceive(receive, limit=limit, settings=self.settings)

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if not bounded.complete:
                    message = _closing(message)
            await send(message)

        try:
            await self.app(scope, bounded, tracked_send)
        except BodyRefused as exc:  # raised where no exception handler answers it
            if started:
                raise
            await reply(send, exc.status_code, str(exc.detail))


async def _refused_caller(scope: Scope, permission: Permission) -> ServiceError | None:
    """Why the caller may not send this route a body (a bad token, a role without
    `permission`, too many bad tokens), verified as the route's own dependency would; None
    when it may. The route checks again, from the token cache."""
    from service.api.deps import principal_of

    try:
        principal = await principal_of(Request(scope))
        principal.require(permission)
    except ServiceError as exc:
        return exc
    return None


def refused_headers(exc: ServiceError) -> dict[str, str]:
    """The headers an auth refusal is answered with."""
    if exc.status_code == 401:
        return {"WWW-Authenticate": "Bearer"}
    if exc.retry_after is not None:
        return {"Retry-After": str(exc.retry_after)}
    return {}


def _closing(start: Message) -> Message:
    """`start` saying the connection ends with this response.

    An answer given before the whole body arrived (405, 404, a refused token) leaves the
    rest of the body unread: uvicorn would go on reading it for as long as the client sends,
    with no deadline and no limit, unless the connection ends with the answer.
    """
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"connection"]
    return {**start, "headers": [*headers, (b"connection", b"close")]}


async def reply(
    send: Send, status: int, detail: str, headers: dict[str, str] | None = None
) -> None:
    """Answer `{"detail": ...}` directly and close the connection (the body stays unread)."""
    body = json.dumps({"detail": detail}).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
    ]
    start: Message = {"type": "http.response.start", "status": status, "headers": raw}
    await send(start)
    await send({"type": "http.response.body", "body": body})
