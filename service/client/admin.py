"""What admins do through the API: tokens (`Client.tokens`) and the audit log."""

from __future__ import annotations

from typing import Any

from .http import Http
from .models import AuditLogPage, Token


class Tokens:
    """API tokens (admins only): create one, list them, revoke one."""

    def __init__(self, http: Http) -> None:
        self._http = http

    def create(self, name: str, role: str, *, expires_in_days: float | None = None) -> Token:
        """A new token; its secret is in `.token`, returned this once and never again."""
        body = {"name": name, "role": role, "expires_in_days": expires_in_days}
        return Token.from_api(self._http.json("POST", "/tokens", json=body))

    def list(self) -> list[Token]:
        """Every token, without secrets."""
        items: list[dict[str, Any]] = self._http.call("GET", "/tokens").json()
        return [Token.from_api(item) for item in items]

    def revoke(self, token_id: int) -> Token:
        """Revoke a token at once."""
        return Token.from_api(self._http.json("POST", f"/tokens/{token_id}/revoke"))


def audit_log(http: Http, *, action: str | None = None, limit: int = 100) -> AuditLogPage:
    """A page of the audit log, newest first, optionally of one action."""
    params: dict[str, Any] = {"limit": limit}
    if action:
        params["action"] = action
    return AuditLogPage.from_api(http.json("GET", "/audit", params=params))
