"""Bearer tokens with roles: creation, verification in constant time, revocation, audit.

A token reads `rpt_<id>_<secret>`; the database keeps the SHA-256 of the whole token only.
The id selects the row and the digests are compared with `hmac.compare_digest`, so the
time an answer takes says nothing about how much of a guess was right.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.errors import Conflict, Forbidden, NotFound, RateLimited, Unauthorized
from service.persistence.models import ApiToken, AuditEvent, utcnow

Role = Literal["admin", "submitter", "worker", "viewer"]
ROLES: tuple[Role, ...] = ("admin", "submitter", "worker", "viewer")
Permission = Literal["read", "submit", "work", "admin"]
# Workers only act on runs through the worker protocol; they read nothing else.
GRANTS: dict[Permission, frozenset[str]] = {
    "read": frozenset({"admin", "submitter", "viewer"}),
    "submit": frozenset({"admin", "submitter"}),
    "work": frozenset({"worker"}),
    "admin": frozenset({"admin"}),
}
TOKEN_PATTERN = re.compile(r"^rpt_(\d{1,18})_([A-Za-z0-9_-]{20,100})$")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's id, name and role."""

    token_id: int
    name: str
    role: str
    expires_at: datetime | None = field(default=None, compare=False)  # the token's own

    def require(self, permission: Permission) -> None:
        """Raise Forbidden (403) unless the role grants `permission`."""
        if self.role not in GRANTS[permission]:
            raise Forbidden(f"role {self.role!r} may not {permission}")


# Bumped by every revocation in this process, so that tokens remembered as valid before it
# (service.auth.token_cache) are checked against the database again.
_revocations = [0]


def revocation_generation() -> int:
    """How many revocations this process has made (see service.auth.token_cache)."""
    return _revocations[0]


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    *,
    db: Session,
    name: str,
    role: Role,
    expires_in_days: float | None = None,
    creator: Principal | None = None,
) -> tuple[ApiToken, str]:
    """A new token row and its secret (shown once; only its hash is stored)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    row = ApiToken(
        name=name,
        role=role,
        secret_hash="",
        created_by_id=creator.token_id if creator else None,
        expires_at=utcnow() + timedelta(days=expires_in_days) if expires_in_days else None,
    )
    db.add(row)
    db.flush()
    secret = f"rpt_{row.id}_{secrets.token_urlsafe(32)}"
    row.secret_hash = _digest(secret)
    audit(
        db=db,
        actor=creator,
        action="token.create",
        target_type="token",
        target_id=row.id,
        details={"name": name, "role": role, "expires_at": str(row.expires_at or "")},
    )
    db.commit()
    return row, secret


def count_tokens(db: Session) -> int:
    """How many tokens exist (zero on a fresh database)."""
    return db.scalar(select(func.count(ApiToken.id))) or 0


def verify(db: Session, token: str) -> Principal:
    """The principal of a valid, unexpired, unrevoked token; Unauthorized otherwise."""
    match = TOKEN_PATTERN.match(token)
    row = db.get(ApiToken, int(match.group(1))) if match else None
    # Compare even when there is no row, so a miss costs what a wrong secret costs.
    expected = row.secret_hash if row is not None else _digest("no such token")
    if not hmac.compare_digest(_digest(token), expected) or row is None:
        raise Unauthorized("invalid token")
    now = utcnow()
    if row.revoked_at is not None:
        raise Unauthorized("token revoked")
    if row.expires_at is not None and row.expires_at <= now:
        raise Unauthorized("token expired")
    if row.last_used_at is None or now - row.last_used_at > timedelta(minutes=1):
        row.last_used_at = now  # coarse, so reads do not turn into a write per request
        db.commit()
    return Principal(token_id=row.id, name=row.name, role=row.role, expires_at=row.expires_at)


def revoke(*, db: Session, token_id: int, actor: Principal) -> ApiToken:
    """Revoke a token; it stops working at once."""
    row = db.get(ApiToken, token_id)
    if row is None:
        raise NotFound(f"token {token_id} does not exist")
    if row.revoked_at is None and row.role == "admin" and _active_admins(db) <= 1:
        raise Conflict("this is the last active admin token; create another admin first")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        audit(
            db=db,
            actor=actor,
            action="token.revoke",
            target_type="token",
            target_id=row.id,
            details={"name": row.name, "role": row.role},
        )
    db.commit()
    # After the commit: a check that starts from now on reads the revoked row.
    _revocations[0] += 1
    return row


def _active_admins(db: Session) -> int:
    now = utcnow()
    return (
        db.scalar(
            select(func.count(ApiToken.id)).where(
                ApiToken.role == "admin",
                ApiToken.revoked_at.is_(None),
                (ApiToken.expires_at.is_(None)) | (ApiToken.expires_at > now),
            )
        )
        or 0
    )


def audit(
    *,
    db: Session,
    actor: Principal | None,
    action: str,
    target_type: str,
    target_id: int | None,
    details: dict[str, Any] | None = None,
) -> None:
    """Add an audit event to the session (committed with the action it records)."""
    db.add(
        AuditEvent(
            token_id=actor.token_id if actor else None,
            actor=actor.name if actor else "server",
            role=actor.role if actor else "system",
            action=action,
            target_type=target_type,
            target_id=target_id,
            details=details or {},
        )
    )


def token_identity(token: str | None) -> str:
    """Whose token this claims to be, for failed-auth accounting: `id:<n>`, or its absence."""
    if token is None:
        return "none"
    match = TOKEN_PATTERN.match(token)
    return f"id:{match.group(1)}" if match else "malformed"


class FailureLimiter:
    """Answers 429 instead of 401 to a client that keeps sending invalid tokens.

    Failures are counted per (client address, presented token identity), so bad tokens
    for one identity never count against another, and per address across all identities
    (`max_per_address`), so presenting a new token id each time does not escape the count.
    A valid token is never refused: it is verified first, whoever else sent bad tokens from
    the same address.
    """

    def __init__(
        self, max_failures: int, window_seconds: float, *, max_per_address: int | None = None
    ) -> None:
        self.max_failures, self.window = max_failures, window_seconds
        self.max_per_address = max_per_address if max_per_address is not None else max_failures
        self._failures: dict[tuple[str, str], deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, key: tuple[str, str], now: float) -> deque[float]:
        failures = self._failures.setdefault(key, deque())
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        return failures

    def failed(self, client: str, identity: str) -> RateLimited | None:
        """Count one invalid token; the 429 to answer with if this key is over the limit."""
        with self._lock:
            now = time.monotonic()
            recent = self._recent((client, identity), now)
            recent.append(now)
            # The address's own count ("*" is never a token identity), capped in length.
            everyone = self._recent((client, "*"), now)
            everyone.append(now)
            while len(everyone) > self.max_per_address + 1:
                everyone.popleft()
            if len(self._failures) > 10_000:  # bound memory under a spray of addresses
                self._failures = {k: v for k, v in self._failures.items() if v}
            if len(recent) <= self.max_failures and len(everyone) <= self.max_per_address:
                return None
            # A retry is counted too: it is let through once no more than limit - 1
            # failures remain in the window, when the (len - limit)th oldest expires.
            retry = max(
                int(q[len(q) - limit] + self.window - now) + 1
                for q, limit in ((recent, self.max_failures), (everyone, self.max_per_address))
                if len(q) > limit
            )
        return RateLimited(f"too many invalid tokens; retry in {retry} s", retry_after=retry)
