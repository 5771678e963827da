"""Recently verified bearer tokens, remembered in memory for a few seconds.

Verifying a token reads its row from the database, in a thread of the pool: on a read
request that is one more query and one more thread round trip next to the route's own.
A token verified less than `REPRO_TOKEN_CACHE_SECONDS` ago is trusted again without them,
on the event loop. Entries are keyed by
the SHA-256 of the whole token (what the database stores), so the secret itself is never
kept, and only valid tokens are remembered: a wrong or unknown token always goes to the
database and to the failed-auth limiter.

Revocation: `auth.revoke` forgets every entry of this process at once (a new revocation
generation), so on a single API process a revoked token stops working immediately. Other
API processes (replicas sharing a PostgreSQL database) notice within the cache lifetime.
A token's own expiry is checked on every hit, so it expires to the second.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass

from service.auth.tokens import Principal, revocation_generation
from service.persistence.models import utcnow

# Past this many remembered tokens the cache starts over (bounds memory under a spray of
# distinct valid tokens, which only an admin can create anyway).
MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class _Entry:
    principal: Principal
    trusted_until: float  # time.monotonic()
    generation: int


class TokenCache:
    """Valid tokens verified in the last `seconds`; `seconds=0` remembers nothing."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def get(self, token: str) -> Principal | None:
        """The principal of a token verified recently and still valid, else None."""
        if self.seconds <= 0:
            return None
        entry = self._entries.get(self.key(token))
        if entry is None:
            return None
        if (
            entry.generation != revocation_generation()
            or time.monotonic() >= entry.trusted_until
            or (entry.principal.expires_at is not None and entry.principal.expires_at <= utcnow())
        ):
            return None
        return entry.principal

    def put(self, token: str, principal: Principal, *, generation: int) -> None:
        """Remember a token just verified against the database; `generation` is the
        revocation generation taken before that database read began."""
        if self.seconds <= 0:
            return
        entry = _Entry(
            principal=principal,
            trusted_until=time.monotonic() + self.seconds,
            generation=generation,
        )
        with self._lock:
            if len(self._entries) >= MAX_ENTRIES:
                self._entries = {}
            self._entries[self.key(token)] = entry
