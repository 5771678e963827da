"""Keyset pages of a list shown newest first, cut on an indexed id column: `before` walks to
older rows, `after` to newer ones, and page 2,000 costs what page 1 does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Select
from sqlalchemy.orm import InstrumentedAttribute, Session

T = TypeVar("T")


@dataclass
class IdPage(Generic[T]):
    items: list[T]
    newer: int | None  # `after` cursor of the previous page, if there is one
    older: int | None  # `before` cursor of the next page, if there is one


def id_page(
    db: Session,
    query: Select[T],
    column: InstrumentedAttribute[int],
    *,
    limit: int,
    before: int | None = None,
    after: int | None = None,
) -> IdPage[T]:
    """One page of the entities `query` selects, newest (highest `column`) first."""

    def key(item: Any) -> int:
        value: int = getattr(item, column.key)
        return value

    if after is not None:
        found = list(
            db.scalars(query.where(column > after).order_by(column.asc()).limit(limit + 1))
        )
        more_newer = len(found) > limit
        items = list(reversed(found[:limit]))
        newer = key(items[0]) if items and more_newer else None
        return IdPage(items, newer, key(items[-1]) if items else None)
    if before is not None:
        query = query.where(column < before)
    found = list(db.scalars(query.order_by(column.desc()).limit(limit + 1)))
    items = found[:limit]
    older = key(items[-1]) if items and len(found) > limit else None
    return IdPage(items, key(items[0]) if items and before is not None else None, older)
