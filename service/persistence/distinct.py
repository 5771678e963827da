"""Distinct values of an indexed column, read by skipping through its index: one lookup per
value however many rows hold it (a plain DISTINCT reads every row)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, literal, select
from sqlalchemy.orm import InstrumentedAttribute, Session


def distinct_values(db: Session, column: InstrumentedAttribute[Any], limit: int) -> list[Any]:
    """The first `limit` distinct non-null values of `column`, in order; `column` must lead
    an index for this to be fast."""
    first = select(func.min(column).label("value"), literal(1).label("n"))
    walk = first.cte("distinct_walk", recursive=True)
    following = select(func.min(column)).where(column > walk.c.value).scalar_subquery()
    walk = walk.union_all(
        select(following, walk.c.n + 1).where(walk.c.value.is_not(None), walk.c.n < limit)
    )
    query = select(walk.c.value).where(walk.c.value.is_not(None)).order_by(walk.c.value)
    return list(db.scalars(query))
