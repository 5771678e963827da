"""Which queued run a claim takes: the highest priority first, then the submitter served
least recently, then that submitter's oldest run.

Fair across submitters (the token that queued a run), not across experiments: a sweep of
500 runs is 500 experiments of one person, and fairness per experiment would still hand
that person 500 turns to everyone else's one. Each claim stamps the submitter's
`queue_turn_at`; a submitter never served (a new token, or runs queued by the server
itself) comes first. Spot-check replays and re-traces count against the submitter of the
run they check. Priorities (0 by default) are set only by admins, at submit or rerun, and
outrank fairness: an urgent run goes next whoever queued the rest.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Select, select, update
from sqlalchemy.orm import Session

from service.auth.tokens import Principal
from service.persistence.models import ApiToken, Run

MAX_PRIORITY = 1000


def ordered(candidates: Select[Any], run: type[Run], submitter: type[ApiToken]) -> Select[Any]:
    """`candidates` (selecting from `run`) in claim order; `submitter` is an alias of
    ApiToken joined here to read each run's submitter's last turn."""
    return candidates.outerjoin(submitter, submitter.id == run.submitter_id).order_by(
        run.priority.desc(), submitter.queue_turn_at.asc().nulls_first(), run.id
    )


def check_priority(priority: int, principal: Principal) -> int:
    """`priority` if the caller may set it: any other than 0 takes an admin (403 else)."""
    if priority != 0:
        principal.require("admin")
    return priority


def take_turn(db: Session, run_id: int, now: datetime) -> None:
    """The submitter of the run just claimed has had its turn."""
    db.execute(
        update(ApiToken)
        .where(ApiToken.id == select(Run.submitter_id).where(Run.id == run_id).scalar_subquery())
        .values(queue_turn_at=now)
        .execution_options(synchronize_session=False)
    )
