"""First-start tokens of an embedded server: an admin token, and one for its own worker."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.orm import Session

from reprotrain.local_token import ADMIN_TOKEN_FILE as ADMIN_TOKEN_FILE  # the client reads it
from service.auth import tokens as auth
from service.auth.tokens import Role
from service.errors import Unauthorized
from service.persistence.file_modes import open_private, private_dir

WORKER_TOKEN_FILE = "worker-token"


def _write_private(path: Path, secret: str) -> None:
    # Owner-only from the first byte (created 0600, whatever the umask), in a 0700 directory.
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp")
    with os.fdopen(open_private(tmp), "w") as fh:
        fh.write(secret + "\n")
    os.replace(tmp, path)


def _valid(db: Session, path: Path) -> str | None:
    if not path.exists():
        return None
    secret = path.read_text().strip()
    try:
        auth.verify(db, secret)
    except Unauthorized:
        return None
    return secret


def ensure_token(
    db: Session, data_dir: Path, filename: str, *, role: Role, name: str
) -> tuple[str, bool]:
    """The token stored in `data_dir/filename`, created if missing or no longer valid.

    Returns (secret, created). An admin token is only created on a database with no
    tokens at all; otherwise the existing admins manage tokens.
    """
    path = data_dir / filename
    secret = _valid(db, path)
    if secret is not None:
        return secret, False
    if role == "admin" and auth.count_tokens(db) > 0:
        raise Unauthorized(
            f"{path} holds no valid admin token and this database already has tokens; "
            "ask an admin for one (`repro token create --role admin`)"
        )
    _, secret = auth.create_token(db=db, name=name, role=role)
    _write_private(path, secret)
    return secret, True


def read_token_file(data_dir: Path) -> str | None:
    """The local admin token, if this machine runs the embedded server."""
    path = data_dir / ADMIN_TOKEN_FILE
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
