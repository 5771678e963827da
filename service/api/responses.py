"""The error answers routes document: one body model, one description per status."""

from __future__ import annotations

from typing import Any

from service.schemas import ErrorOut

_DESCRIPTIONS = {
    400: "Malformed request: a body that is not well-formed, or a bad upload name or digest",
    401: "No valid bearer token (missing, unknown, expired or revoked)",
    403: "The token's role may not do this, or the worker or run belongs to another token",
    404: "No such resource",
    409: "The request conflicts with the resource's current state",
    413: "The request body is larger than this server accepts",
    415: "The request body has a content type this endpoint does not accept",
    422: "Invalid input; `errors` names each field and what is wrong with it",
    429: "Too many invalid tokens from this client; retry later",
    503: "The server is at a configured limit (see `Retry-After`); retry later",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses, each with the ErrorOut body."""
    return {
        status: {"model": ErrorOut, "description": _DESCRIPTIONS[status]} for status in statuses
    }
