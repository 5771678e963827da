"""Dashboard sessions: a signed cookie naming a token, CSRF tokens, one-time login codes
(in the database, so that any API process takes them).

The cookie carries the token's id and a random nonce, signed (itsdangerous) with the
dashboard secret; the token row is looked up on every request, so revoking or expiring
the token ends its sessions at once. The CSRF token of a session is an HMAC of its nonce.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qs, quote

from fastapi import Request
from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy import delete
from sqlalchemy.orm import Session

from service.auth import tokens as auth
from service.auth.tokens import Principal
from service.config import Settings
from service.errors import BodyTooLarge, Forbidden, MalformedBody, ServiceError, Unauthorized
from service.persistence.models import ApiToken, LoginCode, utcnow

SECRET_FILE = "dashboard-secret"
SESSION_COOKIE = "repro_session"
LOGIN_COOKIE = "repro_login"
MAX_FORM_BYTES = 64 * 1024
LOGIN_CODE_SECONDS = 15 * 60


class LoginRequired(ServiceError):
    """Log in to the dashboard first."""

    status_code = 401


def load_secret(settings: Settings) -> bytes:
    """The signing secret: the configured one, else the data directory's, created once."""
    if settings.dashboard_secret:
        return settings.dashboard_secret.encode()
    data_dir = settings.data_dir
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if data_dir.stat().st_uid == os.getuid() and data_dir.stat().st_mode & 0o077:
        data_dir.chmod(0o700)  # it holds tokens and this secret: owner-only
    path = data_dir / SECRET_FILE
    try:
        # O_EXCL: two processes starting at once agree on the file that won.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_secret(path)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32) + "\n")
    return _read_secret(path)


def _read_secret(path: Path) -> bytes:
    for _ in range(50):  # a concurrent creator may not have written it yet
        text = path.read_text().strip()
        if text:
            return text.encode()
        time.sleep(0.01)
    raise RuntimeError(f"{path} is empty; delete it to create a new dashboard secret")


def _code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def issue_code(db: Session, token_id: int, seconds: float = LOGIN_CODE_SECONDS) -> str:
    """A new one-time login code standing for the token until used or `seconds` have
    passed; kept (hashed) in the database, so any API process redeems it. Commits."""
    now = utcnow()
    db.execute(delete(LoginCode).where(LoginCode.expires_at <= now))  # the expired go
    code = secrets.token_urlsafe(24)
    db.add(
        LoginCode(
            code_hash=_code_hash(code),
            token_id=token_id,
            expires_at=now + timedelta(seconds=seconds),
        )
    )
    db.commit()
    return code


def redeem_code(db: Session, code: str) -> Principal | None:
    """Who a valid code logs in as; the code stops working. None for a used, expired or
    unknown code, or one whose token is no longer valid. Commits."""
    found = db.execute(
        delete(LoginCode)
        .where(LoginCode.code_hash == _code_hash(code))
        .returning(LoginCode.token_id, LoginCode.expires_at)
    ).first()
    db.commit()
    if found is None or found.expires_at <= utcnow():
        return None
    return live_principal(db, found.token_id)


def live_principal(db: Session, token_id: int) -> Principal | None:
    """The principal of a token that is neither revoked nor expired and may read."""
    row = db.get(ApiToken, token_id)
    if (
        row is None
        or row.revoked_at is not None
        or (row.expires_at is not None and row.expires_at <= utcnow())
        or row.role not in auth.GRANTS["read"]
    ):
        return None
    return Principal(token_id=row.id, name=row.name, role=row.role)


@dataclass(frozen=True)
class Viewer:
    """Who is looking at the dashboard, and the CSRF token of their session."""

    principal: Principal
    csrf: str

    @property
    def can_act(self) -> bool:
        return self.principal.role in auth.GRANTS["submit"]


class Sessions:
    """Signs, reads and checks dashboard session cookies."""

    def __init__(self, secret: bytes, max_age_seconds: float) -> None:
        self._secret = secret
        self._serializer = URLSafeTimedSerializer(secret, salt="repro-dashboard-session")
        self.max_age = int(max_age_seconds)

    def mac(self, purpose: str, value: str) -> str:
        return hmac.new(self._secret, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    def cookie_for(self, principal: Principal) -> str:
        """A new session cookie value for a verified token's principal."""
        return self._serializer.dumps({"t": principal.token_id, "n": secrets.token_urlsafe(16)})

    def viewer(self, request: Request, db: Session) -> Viewer:
        """The session's viewer; LoginRequired without a valid session of a live token."""
        raw = request.cookies.get(SESSION_COOKIE)
        if not raw:
            raise LoginRequired()
        try:
            data = self._serializer.loads(raw, max_age=self.max_age)
            token_id, nonce = int(data["t"]), str(data["n"])
        except (BadSignature, KeyError, TypeError, ValueError):
            raise LoginRequired("the session is invalid or expired; log in again") from None
        principal = live_principal(db, token_id)
        if principal is None:
            raise LoginRequired("the session's token is no longer valid; log in again")
        return Viewer(principal=principal, csrf=self.mac("csrf", nonce))

    def check_csrf(self, viewer: Viewer, form: dict[str, str]) -> None:
        """Forbidden unless the form carries the session's CSRF token."""
        if not hmac.compare_digest(form.get("csrf", ""), viewer.csrf):
            raise Forbidden("missing or wrong CSRF token; reload the page and try again")


def sessions_of(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.dashboard_sessions
    return sessions


async def read_form(request: Request) -> dict[str, str]:
    """A small urlencoded form body as a dict (first value of each field)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise BodyTooLarge(f"form larger than {MAX_FORM_BYTES} bytes")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if body and kind != "application/x-www-form-urlencoded":
        raise MalformedBody("send the form urlencoded")
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, max_num_fields=50)
    except (UnicodeDecodeError, ValueError):
        raise MalformedBody("the form is not valid urlencoded text") from None
    return {key: values[0] for key, values in fields.items()}


def login_url(path: str) -> str:
    """Where a visitor without a session goes, coming back to `path` afterwards."""
    return "/login?next=" + quote(path, safe="/")


def safe_next(target: str | None) -> str:
    """A local path to go to after login (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def require_submit(viewer: Viewer) -> None:
    """Forbidden unless the viewer's role may act (rerun, cancel, audit, refine)."""
    if not viewer.can_act:
        raise Forbidden(f"role {viewer.principal.role!r} may only look; actions need submitter")


def verify_login(request: Request, db: Session, token: str) -> Principal:
    """The principal of a token typed into the login form (failed attempts are limited)."""
    limiter: auth.FailureLimiter = request.app.state.auth_failures
    client = request.client.host if request.client else "unknown"
    try:
        principal = auth.verify(db, token.strip())
    except Unauthorized:
        limited = limiter.failed(client, auth.token_identity(token.strip()))
        if limited is not None:
            raise limited from None
        raise
    if principal.role not in auth.GRANTS["read"]:
        raise Forbidden(f"a {principal.role} token cannot read the dashboard")
    return principal
