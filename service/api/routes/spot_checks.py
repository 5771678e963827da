"""Spot checks by id (they are asked for on a run: `POST /runs/{id}/spot-checks`)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import IdPath, ReadAccess, SessionDep, SettingsDep
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.api.views import spot_check_out
from service.schemas import SpotCheckOut
from service.verification import spot_checks

router = APIRouter(prefix="/spot-checks", tags=["runs"], route_class=JsonRoute)


@router.get("/{check_id}", response_model=SpotCheckOut, responses=errors(404, 422))
def spot_check(
    check_id: IdPath, db: SessionDep, settings: SettingsDep, _: ReadAccess
) -> SpotCheckOut:
    """A spot check: its segments, their replays and, once all have ended, the outcome."""
    found = spot_checks.get_spot_check(db, check_id, settings)
    return spot_check_out(found, db=db, settings=settings)
