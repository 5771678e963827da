"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from service.api.deps import ReadSessionDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (answered on the event loop: no thread-pool slot needed)."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(db: ReadSessionDep) -> dict[str, str]:
    """The database answers."""
    db.execute(text("SELECT 1"))
    return {"status": "ready"}
